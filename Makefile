# Both targets do all of their set-up on a fresh machine: a local .venv with the package installed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: test demo bench crosscheck compare localisation clean

$(STAMP): pyproject.toml
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -n 2 -q tests

demo: $(STAMP)
	$(PY) -m calib_jax.demo

# The studies (studies/, run from here as `python -m studies.<name>`) write docs/results.
# The README's Results: every loss of studies/compare/config.py, 3 seeds, two datasets (~1 h on
# 2 cores).
compare: $(STAMP)
	$(PY) -m studies.compare --out_dir=docs/results

# CAMs of CE / ALS / ALS + context on clutter_objects: localisation.md, the CAM grids and a
# segmentation confidence-map figure in docs/results (~40 min on 2 cores).
localisation: $(STAMP)
	$(PY) -m studies.localisation --out_dir=docs/results

clean:
	rm -rf $(VENV) .pytest_cache

# ECE and AECE against torchmetrics and torch-uncertainty (the `bench` extra): the values the
# speed benchmarks compare must agree first.
crosscheck: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) crosscheck/torch_metrics.py

# Benchmarks print numbers (BENCHMARKS.md records them with the machine they ran on); these are
# the exact commands behind its tables (13 min on 2 idle cores).
bench: crosscheck
	$(PY) bench/loss_overhead.py --repeats 9 --steps 3
	$(PY) bench/metrics_speed.py --sizes 1e5,1e6,1e7 --classes 10 --baseline-cap-s 60
	$(PY) bench/metrics_speed.py --sizes 1e5,3e5,1e6 --classes 1000 --baseline-cap-s 30 \
	    --skip "torch-uncertainty classwise"
	$(PY) bench/train_step.py
	$(PY) bench/input_pipeline.py --batches 25 --repeats 3
	$(PY) bench/scaling.py --steps 3 --repeats 3
