"""A resume that changes what defines the training stream or the model is refused in one
line before anything is written, unless asked for (then it says where the stream continues);
checkpoints also come by time (`checkpoint_every_seconds`); a translated config's flags left
are logged once."""

import os

import jax
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.checkpoint import checkpointer
from flax_dp_trainer.edge import train


def _files(workdir):
  return sorted(os.path.join(root, name) for root, _, names in os.walk(workdir)
                for name in names)


@pytest.mark.slow
def test_a_resume_with_another_batch_or_seed_is_refused_unless_asked(config, tmp_path,
                                                                     caplog):
  config.update(num_train_steps=4, warmup_steps=1, log_every_steps=2, eval_every_steps=4,
                checkpoint_every_steps=1000, checkpoint_every_seconds=1e-6, keep_checkpoints=5)
  # A translated config's flags left (tools.recipe): logged once, at the start.
  config.not_honoured = ('--weights W: not read here (changes the training)',)
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(config, workdir, devices=jax.devices()[:2])
  assert caplog.text.count('does not follow 1 of its flags (not_honoured):\n  --weights W: '
                           'not read here (changes the training)') == 1, caplog.text
  config.not_honoured = ()
  # By time: every log step is past the second's share since the last save.
  assert checkpointer.Checkpointer(workdir, keep=5).steps() == [2, 4]
  before = {path: os.path.getmtime(path) for path in _files(workdir)}
  config.update(num_train_steps=6, batch_size=64, seed=3)
  with pytest.raises(UserError) as refused:
    train.train_and_evaluate(config, workdir, devices=jax.devices()[:2])
  assert str(refused.value) == (
      f'the checkpoint in {workdir}/checkpoints (step 4) was trained with another stream or '
      "model: batch_size 128 -> 64; seed 0 -> 3; run with the checkpoint's values, pass "
      'another --workdir, or pass --resume_with_changes to continue this run so')
  assert {path: os.path.getmtime(path) for path in _files(workdir)} == before
  state = train.train_and_evaluate(config, workdir, devices=jax.devices()[:2],
                                   resume_with_changes=True)
  assert int(state.step) == 6
  assert ('with changes (--resume_with_changes): batch_size 128 -> 64; seed 0 -> 3; the '
          'training stream continues at example 512 (epoch 0.36) in batches of 64'
          in caplog.text), caplog.text
