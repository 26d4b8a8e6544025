# Both targets do all of their set-up on a fresh machine: a local .venv with the package installed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# The TPU compiler (libtpu, the .[tpu] extra) lives in its own environment: with it installed,
# JAX on a machine without a TPU prints libtpu's initialisation warnings on every program's
# stderr (tests/test_cli_console.py fails on them). Only the dry-run tests use it.
TPU_VENV := .venv-tpu
TPU_PY := $(TPU_VENV)/bin/python
TPU_STAMP := $(TPU_VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
GPU_VENV := .venv-gpu

.PHONY: test demo bench crosscheck compare localisation clean accelerators

# Python's bytecode caches are written, whatever the caller's PYTHONDONTWRITEBYTECODE says: with
# it set, each pytest worker and each program a test starts compiles calib_jax's and the tests'
# sources again (collecting tests/ took 13.2-14.4 CPU-s a process against 8.3-9.7 with the
# caches). pip byte-compiles what it installs (`--no-compile` halved the install's CPU but
# tripled every later TensorFlow import's, 9 -> 21 CPU-s, where the caches cannot be written).
unexport PYTHONDONTWRITEBYTECODE

# uv (installed by the venv's own pip, as it is) installs the package and its dependencies: 11 s
# with its download cache filled, 39 s from PyPI with none, against 110-140 s for pip, measured
# 2026-11-27 on the 2-core machine. It does not byte-compile what it installs: the first process
# to import a module writes its cache (about 16 CPU-s once for the modules the tests import,
# against some 60 to compile every file of TensorFlow and the rest). uv reads no pip
# configuration; a package mirror is named with UV_INDEX_URL or UV_EXTRA_INDEX_URL.
UV := $(VENV)/bin/uv
$(STAMP): pyproject.toml
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv
	$(UV) pip install -q --python $(PY) -e '.[test]'
	touch $@

# .venv-tpu sees .venv's packages (a .pth line adds its site-packages; calib_jax is imported
# from the working tree) and adds only libtpu, the one of the .[tpu] extra's `jax[tpu]` for
# .venv's jax: about 30 s and 700 MB of download instead of a second full install.
# .venv's pip installs into it (`--python`): a venv without its own pip is made in 0.2 CPU-s
# instead of ~5.
$(TPU_STAMP): $(STAMP)
	rm -rf $(TPU_VENV)
	$(PYTHON) -m venv --without-pip $(TPU_VENV)
	echo "import site; site.addsitedir('$$($(PY) -c 'import site; print(site.getsitepackages()[0])')')" \
	    > "$$($(TPU_PY) -c 'import site; print(site.getsitepackages()[0])')/calib_jax_main_venv.pth"
	$(PY) -m pip --python $(TPU_PY) install -q "jax[tpu]==$$($(PY) -c 'import jax; print(jax.__version__)')"
	touch $@

# worksteal: an idle worker takes half of the other's queue (tests/conftest.py orders the
# longest modules first, so the end of the run is quick tests that balance the two workers).
# tests/conftest.py compiles at XLA's optimisation level 0 (faster to compile); the first pass
# also with XLA:CPU's cheaper emitters (CALIB_JAX_TESTS_COMPILER=fast), the second with its
# default ones the three tests marked exact_across_programs (two programs' bits that only the
# default emitters keep equal; collected from the files that mark any: collecting all of tests/
# again costs ~10 s); the dry-run tests compile for TPU at the default level, as a user's dry
# run does.
# The second pass and the dry-run tests (once .venv-tpu is installed) start with the first, at
# the lowest priority: they take only the CPU the first pass leaves (3-10 % of a whole run: its
# workers waiting on the programs they start, and its last tests, when one worker is done) and
# have both cores once it ends, instead of starting after it (66 s more on the 2-core machine,
# 2026-11-28). The second pass is one process (8 CPU-s). Their output is shown after the
# first pass's; any of the three failing (or the install of .venv-tpu, whose log is shown only
# then) fails `make test`.
# (Through SUBMAKE: a recipe line naming $$(MAKE) runs even under `make -n`.)
SUBMAKE = $(MAKE)
# The test processes allocate with TCMalloc where it is installed (Debian's libtcmalloc-minimal4,
# which .ci/run installs): XLA and LLVM compiling the tests' many small programs allocate and
# free heavily. 5 % less CPU with it (median of 3 pairs of the calibrator and loss-gradient
# tests), 8.2 % with tests/conftest.py's garbage-collector settings too (3 pairs of the
# calibrator, loss-gradient, loop, toolkit and sweep tests under -n 2; 2026-11-28). The
# programs the tests start inherit it. Its report of single allocations over 1 GiB is raised
# out of reach: on stderr it would be a stray line in the console tests. Without it the suite
# runs the same, on glibc's malloc.
TCMALLOC := $(firstword $(wildcard /usr/lib/*/libtcmalloc_minimal.so.4 \
                                   /usr/lib/libtcmalloc_minimal.so.4))
ifneq ($(TCMALLOC),)
test: export LD_PRELOAD := $(strip $(TCMALLOC) $(LD_PRELOAD))
test: export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD := 1099511627776
endif
EXACT_FILES = $(shell grep -l 'mark.exact_across_programs' tests/test_*.py)
test: $(STAMP)
	exact_log=$$(mktemp); dry_log=$$(mktemp); \
	nice -n 19 $(PY) -m pytest -q -p no:cacheprovider $(EXACT_FILES) \
	    -m exact_across_programs > $$exact_log 2>&1 & exact=$$!; \
	tpu_log=$$(mktemp); \
	{ nice -n 19 $(SUBMAKE) --no-print-directory $(TPU_STAMP) > $$tpu_log 2>&1 \
	    || { echo "installing $(TPU_VENV) failed:"; cat $$tpu_log; exit 1; }; \
	  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
	    nice -n 19 $(TPU_PY) -m pytest -q -p no:cacheprovider tests/test_dry_run.py; \
	} > $$dry_log 2>&1 & dry=$$!; \
	CALIB_JAX_TESTS_COMPILER=fast $(PY) -m pytest -n 2 --dist worksteal -q tests \
	    --ignore=tests/test_dry_run.py -m "not exact_across_programs"; first_status=$$?; \
	wait $$exact; exact_status=$$?; wait $$dry; dry_status=$$?; \
	echo "tests marked exact_across_programs (XLA's default CPU emitters):"; cat $$exact_log; \
	echo "tests/test_dry_run.py (.venv-tpu):"; cat $$dry_log; rm -f $$exact_log $$dry_log $$tpu_log; \
	test $$first_status -eq 0 && test $$exact_status -eq 0 && test $$dry_status -eq 0

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
	rm -rf $(VENV) $(TPU_VENV) $(GPU_VENV) .pytest_cache

# docs/accelerators.md's zoo table: every config compiled by libtpu and (in .venv-gpu, 4.4 GB
# of CUDA wheels) for H100s; rows already in docs/results/accelerators are kept.
accelerators: $(TPU_STAMP)
	test -x $(GPU_VENV)/bin/python || ($(PYTHON) -m venv $(GPU_VENV) && \
	    $(GPU_VENV)/bin/pip install -q -e '.[gpu]')
	$(TPU_PY) bench/accelerator_zoo.py --part=tpu
	$(GPU_VENV)/bin/python bench/accelerator_zoo.py --part=gpu
	$(PY) bench/accelerator_zoo.py --part=render

# The reference cross-checks (the `bench` extra): ECE and AECE against torchmetrics and
# torch-uncertainty, smooth ECE against relplot, the post-hoc calibrators against scikit-learn,
# scipy, netcal and torch-uncertainty, conformal sets against MAPIE and torch-uncertainty. The
# values the speed benchmarks compare must agree first.
crosscheck: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) crosscheck/torch_metrics.py
	$(PY) crosscheck/relplot_smece.py
	$(PY) crosscheck/calibrators.py --n 5000 --classes 10
	$(PY) crosscheck/conformal.py --n_cal=5000 --n_test=20000 --classes=10,100

# Benchmarks print numbers (BENCHMARKS.md records them with the machine they ran on); these are
# the exact commands behind its tables (13 min on 2 idle cores).
bench: crosscheck
	$(PY) bench/loss_overhead.py --repeats 9 --steps 3
	$(PY) bench/metrics_speed.py --sizes 1e5,1e6,1e7 --classes 10 --baseline-cap-s 60
	$(PY) bench/metrics_speed.py --sizes 1e5,3e5,1e6 --classes 1000 --baseline-cap-s 30 \
	    --skip "torch-uncertainty classwise"
	$(PY) bench/toolkit_speed.py --sizes=1e5,1e6 --classes=10,1000
	$(PY) bench/posthoc_speed.py --sizes 1e5,1e6 --classes 10,100
	$(PY) bench/train_step.py
	$(PY) bench/input_pipeline.py --batches 25 --repeats 3 --cores 1
	$(PY) bench/scaling.py --steps 3 --repeats 3
	$(PY) bench/loop_throughput.py --steps 1000 --repeats 3
	$(PY) bench/sweep_throughput.py --steps 150 --log_every 50 --repeats 2
