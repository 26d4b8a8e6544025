"""The evaluation program behind `eval.py`: the report of a trained run, or of a weight file.

`evaluate_run(config, workdir, split='test')`:
1. builds the config's experiment (`calib_jax.experiment.build`: every config problem in one
   message) and restores the newest (or a given) checkpoint's parameters and BatchNorm
   statistics, and nothing else (no optimiser, no training set); or, with `weights=FILE`,
   reads them from a weight file (ours or PyTorch / safetensors) with no training run at all;
2. runs the evaluators: `report.CalibrationReport` (temperature and p-norm fitted on the fit
   split; calibration and selective metrics of the report split before and after temperature
   scaling), `maps.MapReport` (class activation maps and localisation scores, or pixel
   confidence maps) and, with `eval.toolkit`, `toolkit.PosthocReport` (post-hoc calibrators
   with bootstrap intervals, conformal sets, failure and OOD detection, on the logits the
   calibration report computed) and, with `eval.shift`, `shift.ShiftReport` (the report split
   under each corruption and severity, or angle, with T and the calibrators fitted on the clean
   fit split; resumable);
3. writes `<workdir>/eval_<split>/metrics.json` and the evaluators' files, and returns the
   results.
"""
import json
import os
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections

from calib_jax import experiment as experiment_lib
from calib_jax import sweep as sweep_lib
from calib_jax import ensemble as ensemble_lib
from calib_jax.evaluation import ensembles, maps, predictions, report, toolkit, validation
from calib_jax.evaluation import shift as shift_lib
from calib_jax.experiment import weights as weights_lib
from calib_jax.training import checkpoint as checkpoint_lib
from calib_jax.training import parallel
from calib_jax.training import step as step_lib
from calib_jax.training import reporting

RESULTS_FILE = "metrics.json"
ENSEMBLE_DIR = "ensemble"


def eval_dir(workdir: str, split: str, member: int | None = None) -> str:
  """Where `evaluate_run` writes the results of `split` (of a sweep's `member`)."""
  path = os.path.join(workdir, f"eval_{split}")
  return path if member is None else os.path.join(path, f"member{member}")


def restore_variables(experiment: experiment_lib.Experiment, workdir: str,
                      step: int | None = None, *, member: int | None = None,
                      population: int = 0, members: Sequence[int] | None = None
                      ) -> tuple[dict[str, Any], int]:
  """The model variables (params, batch_stats) of a run's checkpoint (newest unless `step`) and
  its step; of member `member` of a sweep's checkpoint of `population` stacked members, or the
  members `members` of it, still stacked (leading axis `len(members)`). Only
  those arrays are read: no optimiser is built and the training set is not opened, so
  evaluation works whatever the optimiser settings are now."""
  checkpointer = checkpoint_lib.Checkpointer(workdir, read_only=True)
  if checkpointer.latest_step() is None:
    raise FileNotFoundError(f"No checkpoint in {checkpointer.directory}; train first "
                            "(python train.py --config=... --workdir=...)")
  abstract = experiment.abstract_variables()
  if member is not None or members is not None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct((population, *x.shape), x.dtype,
                                                           sharding=x.sharding), abstract)
  variables, meta = checkpointer.restore_variables(abstract, step)
  if member is not None:
    variables = jax.tree.map(lambda x: x[member], variables)
  elif members is not None:
    variables = ensembles.select_members(members, variables)
  checkpointer.close()
  if checkpointer.skipped:
    reporting.warn("; ".join(f"skipped checkpoint {s}, unreadable ({why})"
                             for s, why in checkpointer.skipped)
                   + f"; evaluating step {meta['step']}")
  return variables, int(meta["step"])


def evaluate_run(config: ml_collections.ConfigDict, workdir: str, *, split: str = "test",
                 step: int | None = None, weights: str | None = None,
                 member: int | None = None,
                 devices: list[jax.Device] | None = None) -> dict[str, Any]:
  """Evaluates a trained run and writes `metrics.json` and plots (see the module docstring).

  Args:
    config: the config the run was trained with.
    workdir: the run's work directory (with `checkpoints/`); with `weights`, only where the
      results go (no checkpoint is read).
    split: `test` or `val`: the split to report.
    step: checkpoint step (default: newest); not used with `weights`.
    weights: a weight file to evaluate instead of the run's checkpoint: our variables file or
      a PyTorch / safetensors file of the config's model (`experiment.weights`).
    member: for a sweep's run (`config.sweep`): the member to evaluate, with its overrides
      (`sweep.member_config`); its results go to `<workdir>/eval_<split>/member<i>/`.
    devices: devices of the mesh (default: all).

  Returns:
    The dict written to `metrics.json`: run identification, `fit` (temperature, p-norm and the
    fit split's NLL before/after; `temperature_grid` with `eval.temperature_grid`),
    `pre_temperature` and `post_temperature` (calibration and MSP-selective metrics; also
    `post_temperature_grid` at the grid temperature), `selective` (per confidence score),
    optional `context`, the map report's `localisation` / `seg_maps`, the toolkit's
    `posthoc` (`predictions.evaluate_predictions`' dict), with `eval.shift` the `shift` dict
    (`shift.results_dict`) and `files`; `step` is
    None and `weights` the file's absolute path when `weights` is given.

  Raises:
    ConfigError: the config is invalid (before anything is read).
    FileNotFoundError: no checkpoint in `workdir` (without `weights`), or no `weights` file.
    WeightFileError: a `weights` file that does not fit the config's model.
    ValueError: `member` is missing for a sweep, given for a single run, or out of range.
  """
  parsed = sweep_lib.parse(config)
  if parsed is not None and (member is None or weights):
    raise ValueError(f"{workdir} is a sweep of {parsed.size} members: evaluate one with "
                     f"member=i (eval.py --member=i, 0 <= i < {parsed.size}) or --member=all")
  if parsed is None and member is not None:
    raise ValueError("member= is for a sweep's run; this config has no sweep")
  if parsed is not None and not 0 <= member < parsed.size:
    raise ValueError(f"member={member} is out of range: the sweep has {parsed.size} members "
                     f"(0..{parsed.size - 1})")
  if parsed is not None:
    config = sweep_lib.member_config(config, parsed.members[member])
  experiment = experiment_lib.build(config, devices=devices)
  if weights:
    variables = weights_lib.weight_file_variables(
        experiment.model_recipe, weights, experiment.model, experiment.data.example_input(),
        experiment.mesh)
    source = {"step": None, "weights": os.path.abspath(os.path.expanduser(weights))}
  else:
    variables, ckpt_step = restore_variables(
        experiment, workdir, step, member=member, population=parsed.size if parsed else 0)
    source = {"step": ckpt_step}
    if parsed is not None:
      source.update(member=member, overrides=parsed.members[member])
  calibration = report.CalibrationReport(experiment, split)
  evaluators = [maps.MapReport(experiment, split, calibration.predict)]
  if config.eval.toolkit:
    evaluators.append(toolkit.PosthocReport(experiment, split, calibration))
  if config.eval.shift:  # T and calibrators refitted on the report's clean fit-split logits
    evaluators.append(shift_lib.ShiftReport(
        experiment, split, fit_samples=lambda: calibration.fit_samples,
        progress_dir=eval_dir(workdir, split, member), run_key={**source, "member": member}))
  results = {**source, **calibration.run(variables)}
  for evaluator in evaluators:
    results.update(report.jsonable(evaluator.run(variables)))
  if jax.process_index() == 0:
    out_dir = eval_dir(workdir, split, member)
    results["files"] = {**calibration.write(out_dir)}
    for evaluator in evaluators:
      results["files"].update(evaluator.write(out_dir))
    with open(os.path.join(out_dir, RESULTS_FILE), "w") as f:
      json.dump(results, f, indent=2, sort_keys=True)
  return results


def evaluate_ensemble(config: ml_collections.ConfigDict, workdir: str, *, split: str = "test",
                      step: int | None = None, members: Sequence[int] | None = None,
                      greedy: int | None = None,
                      devices: list[jax.Device] | None = None) -> dict[str, Any]:
  """Evaluates a sweep's members as one ensemble (`eval.py --ensemble`).

  The members' variables are read stacked from the sweep's checkpoint and run as ONE program
  (`step.make_ensemble_predict_fn`) over the fit split (`eval.fit_split`) and `split`; the
  member-stacked logits `[M, N, C]` get `predictions.evaluate_predictions`' report: the
  ensemble (its logits `log p̄`, the members' averaged probabilities) with the post-hoc
  calibrators fitted on the fit split, each member and the mean member, and the ensemble's
  uncertainty scores as failure-detection scores (and OOD detection against `eval.ood`, whose
  set runs through the same program). With `greedy=K`, the K distinct members with
  the lowest fit-split NLL of their average are chosen first (`ensemble.greedy_select`,
  Caruana et al.'s forward selection, without replacement) among `members`. With
  `eval.shift`, `shift` holds the ensemble under shift (`shift.ShiftReport` with the stacked
  program; `mean_member` besides the methods). Results go to `<workdir>/eval_<split>/ensemble/`.

  Args:
    members: member indices (default: all of the sweep's).
    greedy: K of the greedy best-K ensemble (None: all of `members`).
    (the others as `evaluate_run`'s)

  Raises:
    ValueError: the config has no sweep, a member index out of range, K out of range.
  """
  parsed = sweep_lib.parse(config)
  if parsed is None:
    raise ValueError(f"--ensemble evaluates a sweep's members together; the config of {workdir} "
                     "has no sweep (config.sweep is empty)")
  indices = list(range(parsed.size)) if members is None else [int(m) for m in members]
  outside = [m for m in indices if not 0 <= m < parsed.size]
  if outside or not indices:
    raise ValueError(f"member {outside[0] if outside else 'list'} is out of range: the sweep has "
                     f"{parsed.size} members (0..{parsed.size - 1})")
  if greedy is not None:
    ensemble_lib.selection.check_k(greedy, len(indices), with_replacement=False)
  # The members share the model (a sweep varies seeds and loss hyper-parameters only).
  experiment = experiment_lib.build(sweep_lib.member_config(config, parsed.members[indices[0]]),
                                    devices=devices)
  variables, ckpt_step = restore_variables(experiment, workdir, step, members=indices,
                                           population=parsed.size)
  variables = parallel.replicate(variables, experiment.mesh)
  predict = step_lib.make_ensemble_predict_fn(experiment.model, experiment.mesh)
  e = config.eval
  val_x, val_y = validation.stacked_split_logits(experiment, predict, variables, e.fit_split)
  test_x, test_y = validation.stacked_split_logits(experiment, predict, variables, split)
  ood_x = None
  if e.ood:  # The OOD set through the same stacked program (`eval.ood`, as the toolkit's).
    ood_x, _ = validation.stacked_logits(predict, variables, experiment.data.ood_stream(
        e.ood, split, experiment.mesh, max_examples=e.max_examples), experiment.meta.num_classes)
    if not ood_x.shape[1]:
      raise ValueError(f"eval.ood={e.ood!r} holds no samples")
  chosen = None
  if greedy is not None:
    positions = [int(i) for i in ensemble_lib.greedy_select(val_x, val_y, greedy,
                                                            with_replacement=False)]
    chosen = [indices[i] for i in positions]
    val_x, test_x = val_x[positions], test_x[positions]
    ood_x = None if ood_x is None else ood_x[positions]
    indices = chosen
    variables = ensembles.select_members(positions, variables)
  results, fitted = predictions.fit_and_evaluate(
      val_x, val_y, test_x, test_y, ood_logits=ood_x, calibrators=tuple(e.calibrators),
      alphas=tuple(e.conformal_alphas), num_bins=e.num_bins,
      bootstrap_samples=e.bootstrap_samples, seed=config.seed)
  results["ensemble"]["member_indices"] = indices
  results.update(step=ckpt_step, split=split, fit_split=e.fit_split,
                 overrides=[parsed.members[i] for i in indices])
  if e.ood:
    results["ood_set"] = e.ood
  if greedy is not None:
    results["greedy"] = {"k": greedy, "chosen": chosen, "by": f"{e.fit_split} NLL"}
  out_dir = os.path.join(eval_dir(workdir, split), ENSEMBLE_DIR)
  if e.shift:  # the stacked program on shifted images; T and calibrators fitted on val's log p̄
    results.update(report.jsonable(shift_lib.ShiftReport(
        experiment, split, fit_samples=lambda: {"logits": val_x, "labels": val_y}, stacked=True,
        progress_dir=out_dir, run_key={"step": ckpt_step, "members": indices}).run(variables)))
  if jax.process_index() == 0:
    arrays = {"val_logits": ensembles.ensemble_logits(val_x), "val_labels": val_y,
              "test_logits": ensembles.ensemble_logits(test_x), "test_labels": test_y}
    results["files"] = predictions.write_report(out_dir, arrays, results, fitted)
  return results


def format_ensemble(results: dict[str, Any]) -> str:
  """The console report of `evaluate_ensemble`: which members, then the predictions table."""
  members = results["ensemble"]["member_indices"]
  head = (f"ensemble of {len(members)} sweep members {members} — split {results['split']}, "
          f"step {results['step']}")
  if "greedy" in results:
    head += (f"; greedy best {results['greedy']['k']} by {results['greedy']['by']} "
             f"(Caruana et al. 2004)")
  return "\n".join([head, predictions.format_table(results), *shift_lib.format_lines(results)])


def format_table(results: dict[str, Any]) -> str:
  """A plain-text summary of `evaluate_run`'s results: PreT/PosT metrics and selective scores."""
  pre, post = results["pre_temperature"], results["post_temperature"]
  fit = results["fit"]
  who = (f"member {results['member']} ({sweep_lib.overrides_label(results['overrides'])}) — "
         if "member" in results else "")
  lines = [f"{who}{results['dataset']} / {results['model']} / {results['loss']} — split "
           f"{results['split']}, "
           + (f"weights {results['weights']}" if results.get("weights")
              else f"step {results['step']}") + f", {pre['num_samples']} samples",
           f"temperature T = {fit['temperature']:.3f} and p-norm p = {fit['pnorm']} fitted on "
           f"{fit['split']} ({fit['num_samples']} samples)",
           "", f"{'metric':<22}{'PreT':>10}{'PosT':>10}"]
  for key in report.CALIBRATION_KEYS + ("miou",):
    if key in pre:
      lines.append(f"{key:<22}{pre[key]:>10.4f}{post[key]:>10.4f}")
  lines += ["", f"{'score':<18}{'AURC':>10}{'E-AURC':>10}{'AUGRC':>10}"]
  for name, table in results["selective"].items():
    lines.append(f"{name:<18}{table['aurc']:>10.4f}{table['eaurc']:>10.4f}"
                 f"{table['augrc']:>10.4f}")
  if "context" in results:
    ctx = results["context"]
    lines += ["", f"context-only images: accuracy {ctx['accuracy']:.4f}, mean confidence "
                  f"{ctx['average_confidence']:.4f} (uniform {ctx['uniform_confidence']:.4f}), "
                  f"mean entropy {ctx['mean_entropy']:.4f}"]
  return "\n".join(lines + maps.format_lines(results) + toolkit.format_lines(results)
                   + shift_lib.format_lines(results))


def format_members(all_results: list[dict[str, Any]]) -> str:
  """One line per evaluated sweep member (`evaluate_run(..., member=i)` results): its
  overrides, accuracy, ECE before and after temperature scaling, NLL and the MSP's AURC, so
  that `eval.py --member=all` ends with the members side by side."""
  labels = [sweep_lib.overrides_label(r["overrides"]) for r in all_results]
  width = max(len("overrides"), *map(len, labels))
  lines = [f"{'member':>6}  {'overrides':<{width}}{'acc':>8}{'ECE':>8}{'ECE (T)':>9}"
           f"{'NLL':>8}{'AURC':>8}"]
  for label, r in zip(labels, all_results):
    pre, post = r["pre_temperature"], r["post_temperature"]
    lines.append(f"{r['member']:>6}  {label:<{width}}{pre['accuracy']:>8.4f}{pre['ece']:>8.4f}"
                 f"{post['ece']:>9.4f}{pre['nll']:>8.4f}{r['selective']['msp']['aurc']:>8.4f}")
  split = all_results[0]["split"]
  return f"{len(all_results)} members on {split}:\n" + "\n".join(lines)
