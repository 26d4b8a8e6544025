"""Sweeps (`config.sweep`): parsing and its one-line errors, traced loss hyper-parameters, and
the population trained as one program against each member's single run."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from calib_jax import experiment, losses, sweep
from calib_jax.config import ConfigError
from calib_jax.sweep import summary
from calib_jax.run import population
from calib_jax.evaluation import run as evaluation
from calib_jax.training import checkpoint, reporting
from calib_jax.run import loop

from test_run_loop import quick_rng_compilation, tiny_config  # noqa: F401


# ---------------------------------------------------------------------------------------------
# The sweep's text.


def test_members_are_the_product_with_the_first_field_slowest():
  config = tiny_config(loss="mbls", sweep="loss_kwargs.margin=5,10; seed=0,1")
  parsed = sweep.parse(config)
  assert parsed.fields == ("loss_kwargs.margin", "seed")
  assert parsed.members == ({"loss_kwargs.margin": 5.0, "seed": 0},
                            {"loss_kwargs.margin": 5.0, "seed": 1},
                            {"loss_kwargs.margin": 10.0, "seed": 0},
                            {"loss_kwargs.margin": 10.0, "seed": 1})
  assert parsed.label(1) == "loss_kwargs.margin=5.0 seed=1"
  single = sweep.member_config(config, parsed.members[3])
  assert single.loss_kwargs.margin == 10.0 and single.seed == 1 and single.sweep == ""
  assert config.sweep and "margin" not in config.loss_kwargs  # the sweep's config is untouched


@pytest.mark.parametrize("text, message", [
    ("model=mlp,small_cnn", r"^sweep: 'model' changes shapes or the program's structure; "
     r"sweepable fields: seed, loss_kwargs.margin, loss_kwargs.alpha, optimizer.learning_rate, "
     r"optimizer.weight_decay$"),
    ("data.batch_size=16,32", r"'data.batch_size' changes shapes"),
    ("loss_kwargs.gamma=1,2", r"'loss_kwargs.gamma' is not a hyper-parameter of loss 'mbls'"),
    ("optimizer.learnig_rate=0.1", r"'optimizer.learnig_rate' is not a config field"),
    ("seed=", r"^sweep: seed has an empty list of values$"),
    ("seed=0,0", r"seed repeats a value"),
    ("seed=0;seed=1", r"seed is listed twice"),
    ("seed=a", r"seed value 'a' is not an integer"),
    ("loss_kwargs.margin=-1", r"^sweep: mbls: margin=-1.0 is outside \[0.0, inf\]$"),
    ("optimizer.learning_rate=0,0.1", r"learning_rate must be > 0, got 0.0"),
    ("seed 0,1", r"'seed 0,1' is not field=v1,v2"),
])
def test_a_bad_sweep_is_one_line_naming_it(text, message):
  config = tiny_config(loss="mbls", sweep=text)
  with pytest.raises(sweep.SweepError, match=message):
    sweep.parse(config)
  with pytest.raises(ConfigError) as error:  # and the build reports it with the other problems
    experiment.build(config)
  assert sum("sweep:" in line for line in str(error.value).splitlines()) == 1


def test_a_string_hyper_parameter_cannot_vary():
  config = tiny_config(loss="acls", sweep="loss_kwargs.winner_term=1,2")
  with pytest.raises(sweep.SweepError, match="picks another formula"):
    sweep.parse(config)


# ---------------------------------------------------------------------------------------------
# Traced hyper-parameters.


@pytest.mark.parametrize("name", losses.names())
def test_every_real_hyper_parameter_traces_to_the_value_of_its_python_float(name):
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(16, 5)) * 3, jnp.float32)
  labels = jnp.asarray(rng.integers(0, 5, 16))
  extra = {"objectness": jnp.asarray(rng.uniform(-0.2, 1, 16), jnp.float32)} if name == "als" else {}
  defaults = losses.default_hparams(name)
  bind = losses.traced(name)
  at_defaults = losses.get(name)(logits, labels, **extra)  # the same for every key
  for key in losses.real_hparams(name):
    value = defaults[key] * 0.5 + 0.05
    expected = losses.get(name, **{key: value})(logits, labels, **extra)
    traced = jax.jit(lambda v: bind(**{key: v})(logits, labels, **extra))(jnp.float32(value))
    np.testing.assert_allclose(traced, expected, rtol=1e-6, atol=1e-7, err_msg=key)
    # vmapped over members, jitted as in a sweep's step: one value per member, no retrace
    values = jnp.asarray([value, defaults[key]], jnp.float32)
    both = jax.jit(jax.vmap(lambda v: bind(**{key: v})(logits, labels, **extra)))(values)
    np.testing.assert_allclose(both[1], at_defaults, rtol=1e-6, atol=1e-7)


def test_binding_a_string_hyper_parameter_is_refused():
  with pytest.raises(ValueError, match="'winner_term' is not a real hyper-parameter"):
    losses.traced("acls")(winner_term=jnp.float32(1))


# ---------------------------------------------------------------------------------------------
# The population against its members' single runs.


def _member_leaves(state, index):
  state = jax.device_get(state)
  return jax.tree.leaves(population.member_tree((state.params, state.batch_stats,
                                                  state.opt_state, state.step), index))


def _leaves(state):
  state = jax.device_get(state)
  return jax.tree.leaves((state.params, state.batch_stats, state.opt_state, state.step))


def _sweep_config(**overrides):
  return tiny_config(**{"loss": "mbls", "num_train_steps": 8, "eval_every_steps": 8,
                        "log_every_steps": 4, "checkpoint_every_steps": 4,
                        "sweep": "loss_kwargs.margin=2,10;seed=0,1", **overrides})


# Runs whose state alone is checked: no periodic validation, one checkpoint at the end (they read
# the state, never change it; calls keep `log_every_steps`' 4 steps). The val rows and periodic
# checkpoints are checked on `trained_sweep` and in the resumed test.
_STATE_ONLY = {"eval_every_steps": 0, "checkpoint_every_steps": 8}


@pytest.fixture(scope="module")
def trained_sweep(tmp_path_factory):
  """The 4-member sweep of `_sweep_config`, trained once for the tests below."""
  tmp_path = tmp_path_factory.mktemp("sweep_run")
  config = _sweep_config()
  state = loop.train_and_evaluate(config, str(tmp_path / "sweep"))
  return config, state, tmp_path


def test_members_train_like_their_single_runs(trained_sweep):
  """Members 0 and 3 of the 2 x 2 grid (margin 2 with seed 0, margin 10 with seed 1: they
  differ in both), each against its single run on the suite's 4 devices. Every member of a
  sweep is checked against its single run, bit for bit on one device, in
  `test_on_one_device_each_member_is_its_single_run_bit_for_bit`."""
  config, state, tmp_path = trained_sweep
  parsed = sweep.parse(config)
  records = reporting.read_metrics(str(tmp_path / "sweep"))
  result = summary.read(str(tmp_path / "sweep"))
  assert [parsed.members[i] for i in (0, 3)] == [
      {"loss_kwargs.margin": 2.0, "seed": 0}, {"loss_kwargs.margin": 10.0, "seed": 1}]
  for index in (0, 3):
    overrides = parsed.members[index]
    workdir = str(tmp_path / f"single{index}")
    single = loop.train_and_evaluate(sweep.member_config(config, overrides), workdir)
    # To rounding: over the 4 data-parallel devices the unrolled program may sum the gradients'
    # all-reduce in another order than the single run's (bit for bit on one device, below).
    for got, want in zip(_member_leaves(state, index), _leaves(single), strict=True):
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    single_val = [r for r in reporting.read_metrics(workdir) if r["split"] == "val"][-1]
    member_val = [r for r in records if r["split"] == "val" and r["member"] == index][-1]
    assert member_val["overrides"] == json.loads(json.dumps(overrides))
    for key in ("ece", "nll", "accuracy"):
      assert abs(member_val[key] - single_val[key]) <= 1e-5, key
    assert abs(result["members"][index]["val"]["ece"] - single_val["ece"]) <= 1e-5
  # Train rows: one per member per logging step, tagged with its overrides.
  train = [r for r in records if r["split"] == "train"]
  assert sorted({(r["step"], r["member"]) for r in train}) == [
      (s, m) for s in (4, 8) for m in range(4)]
  # sweep.json: the best members and the mean ± std over the two seeds of each margin.
  assert [s["overrides"] for s in result["settings"]] == [{"loss_kwargs.margin": 2.0},
                                                         {"loss_kwargs.margin": 10.0}]
  eces = [m["val"]["ece"] for m in result["members"]]
  assert result["best"]["val_ece"]["member"] == int(np.argmin(eces))
  first = result["settings"][0]["val"]["ece"]
  assert first["mean"] == pytest.approx(np.mean(eces[:2]))
  assert first["std"] == pytest.approx(np.std(eces[:2], ddof=1))
  for member in result["members"]:
    assert set(member["val"]) >= {"accuracy", "ece", "nll", "temperature"}
    assert set(member["test"]) >= {"accuracy", "ece", "nll", "ece_ts"}


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_on_one_device_each_member_is_its_single_run_bit_for_bit(tmp_path, model):
  """Focal loss's gamma = 2 is the case a compiler specialises (`p ** 2.0` -> `p * p`) when it
  sees the value: a single run's gamma reaches the step as an opaque scalar, as a member's
  traced one does (`losses.traced`), so the two compile to the same arithmetic. The MLP's
  members run one after another (`map`), the CNN's unrolled (CPU's "auto"); the CNN's
  batch-norm running averages (not read by training) come out of the unrolled program's
  fusions to rounding, its parameters and optimiser state bit for bit."""
  kind = {"model": "mlp", "model_kwargs": {"hidden": (16,)}} if model == "mlp" else {}
  config = _sweep_config(**kind, loss="focal", sweep="loss_kwargs.gamma=2,5", eval_every_steps=0,
                         num_train_steps=8, checkpoint_every_steps=8)
  one_device = jax.devices()[:1]
  state = loop.train_and_evaluate(config, str(tmp_path / "sweep"), devices=one_device)
  for index, overrides in enumerate(sweep.parse(config).members):
    single = loop.train_and_evaluate(sweep.member_config(config, overrides),
                                     str(tmp_path / f"single{index}"), devices=one_device)
    member = jax.device_get(population.member_tree(state, index))
    single = jax.device_get(single)
    for got, want in zip(jax.tree.leaves((member.params, member.opt_state, member.step)),
                         jax.tree.leaves((single.params, single.opt_state, single.step)),
                         strict=True):
      np.testing.assert_array_equal(got, want)
    for got, want in zip(jax.tree.leaves(member.batch_stats), jax.tree.leaves(single.batch_stats),
                         strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_the_sweep_table_shows_each_setting_over_its_seeds_and_the_best_members(trained_sweep):
  """`summary.format_table`, what train.py prints at the end of a sweep, and the val lines'
  member labels."""
  _, _, tmp_path = trained_sweep
  content = summary.read(str(tmp_path / "sweep"))
  lines = summary.format_table(content).splitlines()
  assert lines[0].split()[:2] == ["setting", "seeds"] and len(lines) == 4
  for line, setting in zip(lines[1:3], content["settings"], strict=True):
    margin = setting["overrides"]["loss_kwargs.margin"]
    cell = setting["test"]["ece"]
    assert line.startswith(f"loss_kwargs.margin={margin} ")
    assert f"{cell['mean']:.4f} ± {cell['std']:.4f}" in line and line.split()[1] == "2"
  best = content["best"]["val_ece"]
  assert f"ECE member {best['member']} (loss_kwargs.margin=" in lines[3]
  assert loop._member_label({"member": 3, "overrides": {"loss_kwargs.margin": 10.0,
                                                         "seed": 1}}) == (
      " member 3 (loss_kwargs.margin=10.0 seed=1)")
  assert loop._member_label({}) == ""


def test_a_resumed_sweep_ends_where_an_uninterrupted_one_does(trained_sweep, tmp_path):
  _, state, _ = trained_sweep
  workdir = str(tmp_path / "resumed")
  config = _sweep_config(eval_every_steps=0)  # no periodic validation, as `_STATE_ONLY`
  first = _sweep_config(stop_after_steps=4, eval_every_steps=0)
  loop.train_and_evaluate(first, workdir)
  saved = checkpoint.Checkpointer(workdir, read_only=True)
  assert saved.latest_step() == 4
  saved.close()
  assert not os.path.exists(os.path.join(workdir, summary.SWEEP_FILE))  # not finished yet
  resumed = loop.train_and_evaluate(config, workdir)
  for got, want in zip(_leaves(resumed), _leaves(state), strict=True):
    np.testing.assert_array_equal(got, want)
  assert os.path.exists(os.path.join(workdir, summary.SWEEP_FILE))
  # A finished sweep whose sweep.json was lost (stopped while writing it) writes it again.
  os.remove(os.path.join(workdir, summary.SWEEP_FILE))
  loop.train_and_evaluate(config, workdir)
  assert summary.read(workdir)["members"][0]["overrides"] == {"loss_kwargs.margin": 2.0, "seed": 0}


def test_eval_reports_one_member_like_its_single_run_would(trained_sweep):
  config, _, tmp_path = trained_sweep
  workdir = str(tmp_path / "sweep")
  # The report without the post-hoc toolkit and the CAM grid, which read the member's
  # variables as the report does (test_evaluation_toolkit.py and test_evaluation_maps.py check
  # them): the member's numbers here are the report's.
  config = config.copy_and_resolve_references()
  config.eval.toolkit, config.eval.cam_images = False, 0
  results = evaluation.evaluate_run(config, workdir, split="val", member=2)
  assert results["member"] == 2 and results["overrides"] == {"loss_kwargs.margin": 10.0,
                                                            "seed": 0}
  assert results["loss"] == "mbls"
  member = summary.read(workdir)["members"][2]
  assert results["pre_temperature"]["ece"] == pytest.approx(member["val"]["ece"], abs=1e-5)
  assert os.path.exists(os.path.join(evaluation.eval_dir(workdir, "val", 2), "metrics.json"))
  # eval.py --member=all ends with the members side by side (`format_members`).
  other = {**results, "member": 3, "overrides": {"loss_kwargs.margin": 10.0, "seed": 1}}
  table = evaluation.format_members([results, other]).splitlines()
  assert table[0] == "2 members on val:" and table[1].split()[:2] == ["member", "overrides"]
  pre = results["pre_temperature"]
  assert table[2].split() == ["2", "loss_kwargs.margin=10.0", "seed=0", f"{pre['accuracy']:.4f}",
                              f"{pre['ece']:.4f}", f"{results['post_temperature']['ece']:.4f}",
                              f"{pre['nll']:.4f}", f"{results['selective']['msp']['aurc']:.4f}"]
  assert table[3].split()[:3] == ["3", "loss_kwargs.margin=10.0", "seed=1"]
  with pytest.raises(ValueError, match="is a sweep of 4 members"):
    evaluation.evaluate_run(config, workdir, split="val")
  with pytest.raises(ValueError, match=r"member=4 is out of range: the sweep has 4 members"):
    evaluation.evaluate_run(config, workdir, split="val", member=4)


def test_eval_reports_the_members_as_one_ensemble(trained_sweep):
  """`evaluate_ensemble` (eval.py --ensemble): the stacked forward pass gives each member the
  test metrics its own predict step gave `sweep.json`; the ensemble is the report of log p̄."""
  config, _, tmp_path = trained_sweep
  workdir = str(tmp_path / "sweep")
  config = config.copy_and_resolve_references()
  config.eval.calibrators, config.eval.bootstrap_samples = ("temperature",), 0
  config.eval.ood = "val"  # any set: it goes through the same stacked program
  results = evaluation.evaluate_ensemble(config, workdir, members=[0, 2, 3])
  written = summary.read(workdir)["members"]
  part = results["ensemble"]
  assert part["member_indices"] == [0, 2, 3] and results["overrides"][1] == written[2]["overrides"]
  for index, row in zip([0, 2, 3], part["members"]):
    for key in ("accuracy", "ece", "nll"):
      assert row[key] == pytest.approx(written[index]["test"][key], abs=1e-5), (index, key)
  assert part["mean_member"]["nll"] == pytest.approx(
      np.mean([written[i]["test"]["nll"] for i in (0, 2, 3)]), abs=1e-5)
  assert part["ensemble"]["nll"] <= part["mean_member"]["nll"]  # Jensen
  assert {"mutual_information", "disagreement"} <= set(results["failure"])
  assert results["ood_set"] == "val" and results["num_ood"] > 0
  assert {"msp", "mutual_information"} <= set(results["ood"])
  assert os.path.exists(os.path.join(evaluation.eval_dir(workdir, "test"), "ensemble",
                                     "metrics.json"))
  assert evaluation.format_ensemble(results).startswith(
      "ensemble of 3 sweep members [0, 2, 3] — split test")
  # The greedy best 3 by validation NLL: its first pick is the member with the lowest val NLL.
  # (3 members, as above: the report's programs are those of [0, 2, 3], compiled once.)
  greedy = evaluation.evaluate_ensemble(config, workdir, greedy=3)
  best = min(range(4), key=lambda i: written[i]["val"]["nll"])
  assert greedy["greedy"]["chosen"][0] == best and len(set(greedy["greedy"]["chosen"])) == 3
  with pytest.raises(ValueError, match=r"^member 4 is out of range: the sweep has 4 members "
                     r"\(0\.\.3\)$"):
    evaluation.evaluate_ensemble(config, workdir, members=[1, 4])
  with pytest.raises(ValueError, match=r"k = 5 is out of range"):
    evaluation.evaluate_ensemble(config, workdir, greedy=5)
  single = config.copy_and_resolve_references()
  single.sweep = ""
  with pytest.raises(ValueError, match=r"has no sweep \(config.sweep is empty\)$"):
    evaluation.evaluate_ensemble(single, workdir)


@pytest.mark.parametrize("members_as", ["map", "vmap"])
def test_members_split_over_a_2d_mesh_train_like_the_unrolled_population(
    trained_sweep, tmp_path, members_as):
  """Two ways to lay the members out, at once: split over 2 member shards x the devices' other
  half as data shards (2 x 2 on the suite's 4 devices), and within each shard run one after another (`lax.map`) or vmapped, instead of unrolled
  (`trained_sweep`: "auto" for this CNN on CPU)."""
  config, state, _ = trained_sweep
  assert population.Population(experiment.build(config)).members_as == "unroll"
  assert jax.device_count() % 2 == 0 and jax.device_count() >= 4  # data shards too
  split = loop.train_and_evaluate(
      _sweep_config(sweep_member_shards=2, sweep_members_as=members_as, **_STATE_ONLY),
      str(tmp_path / "2d"))
  leaf = jax.tree.leaves(split.params)[0]
  assert leaf.sharding.spec[0] == "member" and leaf.sharding.mesh.shape == {
      "member": 2, "data": jax.device_count() // 2}
  for got, want in zip(_leaves(split), _leaves(state), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("overrides, message", [
    ({"sweep_member_shards": 3}, r"sweep_member_shards=3 does not divide the sweep's 4 members"),
    ({"sweep_member_shards": 2, "sweep": "seed=0,1,2,3,4,5,6,7"}, None),
    ({"sweep_member_shards": 2, "sweep": ""}, r"sweep_member_shards > 1 needs a sweep"),
    ({"sweep_members_as": "pmap"}, r"sweep_members_as must be one of auto, vmap, map, unroll, got 'pmap'"),
])
def test_member_shards_are_checked(overrides, message):
  config = _sweep_config(**overrides)
  if message is None:  # valid: 2 member shards x the other half of the devices as data shards
    assert experiment.build(config).mesh.shape == {"member": 2, "data": jax.device_count() // 2}
    return
  with pytest.raises(ConfigError, match=message):
    experiment.build(config)


def test_member_shards_must_divide_each_process_devices():
  """Across processes each member shard takes an equal share of every process's devices
  (`parallel.make_mesh`): 8 shards of 8 devices on one process, but not over 2 processes of 4."""
  config = _sweep_config(sweep_member_shards=8, sweep="seed=0,1,2,3,4,5,6,7")
  assert sweep.spec.check(config, 8) == ([], 8)
  assert sweep.spec.check(config, 8, num_processes=2) == (
      ["sweep_member_shards=8 does not divide each of the 2 processes' 4 devices"], 1)
  assert sweep.spec.check(_sweep_config(sweep_member_shards=2), 8, num_processes=2) == ([], 2)


def test_a_sweep_with_the_training_set_on_the_devices_trains_like_the_tf_data_sweep(
    trained_sweep, tmp_path):
  """`data.on_device`: each of the 2 seed streams' positions `[2, batch]` gather its batches
  on the devices, each member takes its seed's: the same stacked state, bit for bit."""
  _, state, _ = trained_sweep
  on_device = loop.train_and_evaluate(_sweep_config(**{"data.on_device": True}, **_STATE_ONLY),
                                      str(tmp_path / "on_device"))
  for got, want in zip(_leaves(on_device), _leaves(state), strict=True):
    np.testing.assert_array_equal(got, want)


def test_an_mlp_sweep_on_cpu_runs_member_after_member_like_vmap_and_its_single_runs(tmp_path):
  """"auto" on CPU for a model without convolutions is `map` with each member's k = 4 steps in
  a row (`population.members_as`): the same members as `vmap` and as their single runs, with
  the training set from tf.data and on the devices (`data.on_device`: the same stacked state,
  bit for bit, so the on-device map's members are their single runs too)."""
  mlp = {"model": "mlp", "model_kwargs": {"hidden": (16,)}, **_STATE_ONLY}  # calls of k = 4
  on_device = {**mlp, "data.on_device": True}
  config = _sweep_config(**mlp)
  assert population.Population(experiment.build(config)).members_as == "map"
  assert population.Population(experiment.build(_sweep_config(**on_device))).members_as == "map"
  looped = loop.train_and_evaluate(config, str(tmp_path / "map"))
  looped_on_device = loop.train_and_evaluate(_sweep_config(**on_device),
                                             str(tmp_path / "map_on_device"))
  for got, want in zip(_leaves(looped_on_device), _leaves(looped), strict=True):
    np.testing.assert_array_equal(got, want)
  vmapped = loop.train_and_evaluate(_sweep_config(**on_device, sweep_members_as="vmap"),
                                    str(tmp_path / "vmap_on_device"))
  for got, want in zip(_leaves(looped_on_device), _leaves(vmapped), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  overrides = sweep.parse(config).members[3]
  single = loop.train_and_evaluate(sweep.member_config(config, overrides),
                                   str(tmp_path / "single3"))
  for got, want in zip(_member_leaves(looped, 3), _leaves(single), strict=True):
    np.testing.assert_array_equal(got, want)


def test_auto_members_as_on_cpu_is_map_for_a_dense_model_and_unroll_for_a_convolutional_one():
  cpu = experiment.build(_sweep_config()).mesh
  assert population.members_as("auto", cpu, calls_each_step=False) == "map"
  assert population.members_as("auto", cpu, calls_each_step=True) == "unroll"
  assert population.members_as("vmap", cpu, calls_each_step=False) == "vmap"
