"""The checkpoints of the best evaluations (`config.keep_best`): kept beside the newest across
a resume and saves by time, named by step='best' (`load`, `--eval_step`, export), marked by
show_metrics; and the refusals."""

import collections
import json
import os
import shutil

import numpy as np
import pytest

import flax_dp_trainer as trainer
from flax_dp_trainer.base import cli
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer as checkpoint
from flax_dp_trainer.checkpoint import meta as run_meta
from flax_dp_trainer.configs import default
from flax_dp_trainer.loop import cadence
from flax_dp_trainer.edge import checks
from flax_dp_trainer.edge import train
from flax_dp_trainer.loop import writers
from flax_dp_trainer.runs import run_metrics
from flax_dp_trainer.tools import show_metrics

# Evaluations every 10 steps; saves by time at every log step between them (no evaluation):
# each evaluation's checkpoint competes with them and with the newest. Ranked lowest
# accuracy first (best_mode='min'), the best are the first evaluations, never the newest:
# what is kept as best, and what step='best' names, cannot be the newest by chance.
RUN = dict(model='mlp', warmup_steps=5, learning_rate=0.02, log_every_steps=5,
           eval_every_steps=10, checkpoint_every_steps=1000, checkpoint_every_seconds=1e-6,
           keep_checkpoints=1, keep_best=2, best_metric='eval_accuracy', best_mode='min')
FIRST, LAST = 30, 60  # The first session's last step, the resumed session's.


def _evaluations(workdir: str) -> dict[int, list[float]]:
  """{step: [eval_accuracy as each write of metrics.jsonl recorded it]}."""
  found = collections.defaultdict(list)
  with open(os.path.join(workdir, 'metrics.jsonl'), encoding='utf-8') as f:
    for line in f:
      record = json.loads(line)
      if 'eval_accuracy' in record:
        found[record['step']].append(record['eval_accuracy'])
  return found


def _best(values: dict[int, float], n: int, mode: str = 'min') -> list[int]:
  """The steps of the n best `values` by `mode` (RUN's: the lowest), of equal ones the latest
  (as orbax's BestN ranks them)."""
  sign = 1 if mode == 'max' else -1
  return sorted(sorted(values, key=lambda step: (sign * values[step], step))[-n:])


@pytest.fixture(scope='module')
def run(tfds_data_dir, tmp_path_factory):
  """RUN trained to FIRST, then resumed to LAST: (workdir, the steps kept after the first
  session, the final config)."""
  workdir = str(tmp_path_factory.mktemp('best'))
  config = default.get_config()
  config.update(dict(RUN, tfds_data_dir=tfds_data_dir, num_train_steps=FIRST))
  train.train_and_evaluate(config, workdir)
  first = checkpoint.Checkpointer(workdir, keep=1).steps()
  config.num_train_steps = LAST
  train.train_and_evaluate(config, workdir)
  return workdir, first, config


@pytest.mark.slow
def test_the_newest_and_the_best_evaluations_are_kept_across_a_resume(run):
  workdir, first, _ = run
  evaluations = _evaluations(workdir)
  # The resume went on from the newest (step FIRST), not from a best one: no step ran twice.
  assert sorted(evaluations) == list(range(10, LAST + 1, 10))
  assert all(len(values) == 1 for values in evaluations.values())
  accuracies = {step: values[0] for step, values in evaluations.items()}
  before = {step: v for step, v in accuracies.items() if step <= FIRST}
  assert first == sorted({FIRST, *_best(before, 2)})
  kept = checkpoint.Checkpointer(workdir, keep=1).steps()
  assert kept == sorted({LAST, *_best(accuracies, 2)})
  for step in kept:  # Each holds its evaluation's scalars (and the newest its own).
    meta = checkpoint.read_meta(workdir, step)[1]
    assert meta.evaluation['eval_accuracy'] == accuracies[step]


def test_load_best_predicts_its_evaluation_exactly(run):
  workdir, _, _ = run
  accuracies = {step: values[-1] for step, values in _evaluations(workdir).items()}
  best = _best(accuracies, 1)[0]
  trained = trainer.load(workdir, step='best')
  assert trained.step == best < LAST
  images, labels = trained.read_split()
  correct = int(np.sum(trained.predict(images) == np.asarray(labels)))
  assert correct == round(accuracies[best] * len(labels))
  # show_metrics marks the same step, by the run's recorded best_metric.
  assert show_metrics.ranking(workdir) == ('eval_accuracy', 'min')
  scalars, _ = run_metrics.read_events(workdir)
  assert show_metrics.best_step(scalars['eval_accuracy'], 'min') == best
  assert f'{scalars["eval_accuracy"][best]:.6g}*' in show_metrics.table(
      scalars, ['eval_accuracy'], ('eval_accuracy', best))


def test_eval_only_evaluates_the_best_checkpoint(run, tmp_path):
  workdir, _, config = run
  copy = str(tmp_path / 'copy')
  shutil.copytree(workdir, copy)
  accuracies = {step: values[-1] for step, values in _evaluations(workdir).items()}
  scalars = train.evaluate_only(config, copy, step=cli.checkpoint_step('best', '--eval_step'))
  assert scalars['eval_accuracy'] == accuracies[_best(accuracies, 1)[0]]
  # An older step's evaluation goes to a file of its own: metrics.jsonl's steps never fall.
  steps = [r['step'] for r in writers.read_jsonl(os.path.join(copy, writers.JSONL_NAME))]
  assert steps == sorted(steps) and steps[-1] == LAST
  earlier = writers.read_jsonl(os.path.join(copy, writers.EARLIER_EVALS_NAME))
  assert [(r['step'], r['eval_accuracy']) for r in earlier] == [
      (_best(accuracies, 1)[0], scalars['eval_accuracy'])]
  with pytest.raises(UserError, match=r'--eval_step=7: .* has no checkpoint at step 7; it has '
                                      r'steps'):
    train.evaluate_only(config, copy, step=7)


def _save(workdir: str, evaluation=None, best=None, **config) -> None:
  """A checkpoint at step 5 of a tiny state, written with `config` over the default's."""
  saver = checkpoint.Checkpointer(workdir, keep=1, best=best)
  saver.save(5, {'params': {'w': np.zeros(2, np.float32)}}, run_meta.RunMeta(
      rng=np.zeros(2, np.uint32), data_seed=0, examples_seen=0, devices=1, processes=1,
      config=dict(default.get_config().to_dict(), **config), evaluation=evaluation))
  saver.close()


def _saves(workdir: str, accuracies) -> list[int]:
  """The steps kept after saves at steps 1, 2, ... of `accuracies` (None: a save without an
  evaluation, by time or on a stop) with keep_checkpoints=1, keep_best=2."""
  saver = checkpoint.Checkpointer(workdir, keep=1, best=checkpoint.Best.of(2, 'eval_accuracy'))
  for step, accuracy in enumerate(accuracies, 1):
    saver.save(step, {'params': {'w': np.zeros(2, np.float32)}}, run_meta.RunMeta(
        rng=np.zeros(2, np.uint32), data_seed=0, examples_seen=0, devices=1, processes=1,
        config=dict(default.get_config().to_dict(), keep_best=2),
        evaluation=None if accuracy is None else {'eval_accuracy': accuracy}))
    saver.wait()
  saver.close()
  return saver.steps()


def test_the_best_by_a_higher_accuracy_beside_saves_without_one(tmp_path):
  workdir = str(tmp_path / 'run')
  # The two best (of equal ones the latest), and the newest.
  assert _saves(workdir, [0.5, 0.9, None, 0.7, 0.9, 0.8, None]) == [2, 5, 7]
  assert checkpoint.resolve_step(workdir, 'best') == 5
  # Saves without an evaluation count toward the newest alone, however few the evaluated.
  assert _saves(str(tmp_path / 'few'), [None, None]) == [2]
  assert _saves(str(tmp_path / 'one'), [None, 0.5]) == [2]


def test_best_is_refused_without_keep_best_or_an_evaluation(tmp_path):
  without = str(tmp_path / 'without')
  _save(without, evaluation={'eval_accuracy': 0.5})
  with pytest.raises(UserError, match=r"step='best': the run in .* was trained without "
                                      r'keep_best, .* --config.keep_best=K, or name one of its '
                                      r'steps \(5\)'):
    trainer.load(without, step='best')
  unevaluated = str(tmp_path / 'unevaluated')
  _save(unevaluated, best=checkpoint.Best.of(2, 'eval_accuracy'), keep_best=2)
  with pytest.raises(UserError, match=r"step='best': no checkpoint in .* holds an evaluation's "
                                      r'eval_accuracy \(steps 5\)'):
    checkpoint.resolve_step(unevaluated, 'best')
  with pytest.raises(UserError, match=r"--step='last' is neither a step number nor 'best'"):
    cli.checkpoint_step('last', '--step')
  assert [cli.checkpoint_step(v, '--step') for v in (None, '', '12', 'best')] == [
      None, None, 12, 'best']


@pytest.mark.parametrize('overrides,message', [
    (dict(keep_best=-1), r'keep_best=-1 must be a whole number >= 0'),
    (dict(keep_best=2, best_mode='up'), r"best_mode='up' is unknown; choose 'max'"),
    # A typo: named as such, not asked which way it is better.
    (dict(keep_best=2, best_metric='eval_acc'),
     r"best_metric='eval_acc' is not a scalar this run's evaluations write; choose one of: "
     r'eval_loss, eval_accuracy'),
    (dict(keep_best=2, best_metric='eval_ema_accuracy'),
     r"best_metric='eval_ema_accuracy' is not a scalar this run's evaluations write; choose "
     r'one of: eval_loss, eval_accuracy, eval_top5_accuracy \(--config.best_metric=TAG\)'),
    (dict(keep_best=2, best_metric='eval_test_loss', eval_splits='train'),
     r"best_metric='eval_test_loss' is not a scalar .* eval_train_loss"),
])
def test_bad_best_fields_are_refused(overrides, message):
  config = default.get_config()
  config.update(overrides)
  with pytest.raises(UserError, match=message):
    checks.check_fields(config, process_count=1, local_device_count=1)


@pytest.mark.parametrize('overrides', [
    dict(keep_best=2, best_metric='eval_ema_accuracy', ema_decay=0.9),
    dict(keep_best=2, best_metric='eval_test_loss', eval_splits='test'),
    dict(keep_best=1, best_metric='eval_top5_accuracy', best_mode='min'),
    dict(keep_best=0, best_metric='anything'),
])
def test_good_best_fields_pass(overrides):
  config = default.get_config()
  config.update(overrides)
  checks.check_fields(config, process_count=1, local_device_count=1)


def test_every_evaluation_saves_with_keep_best():
  plain = cadence.Cadence(log_every=5, eval_every=10, save_every=25, last=60)
  best = cadence.Cadence(log_every=5, eval_every=10, save_every=25, last=60, save_at_eval=True)
  assert [s for s in range(1, 61) if plain.save(s)] == [25, 50, 60]
  assert [s for s in range(1, 61) if best.save(s)] == [10, 20, 25, 30, 40, 50, 60]


def test_the_ddp_twin_refuses_keep_best():
  from flax_dp_trainer.pytorch.twin import step as ddp_step  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.keep_best = 2
  with pytest.raises(UserError, match=r'keep_best=2 has no DDP twin yet; the twin supports 0'):
    ddp_step.check_supported(config)
