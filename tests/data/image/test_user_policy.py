"""A user's augmentation policy, one file registering one record (`data.image.policy_records`)
from a module in `config.imports`: `show_batch` draws it in the run's own pipeline and its
preprocessing line names it, and a value of its settings it cannot take is refused in one
line with status 2, before anything is written. The commands run as a user runs them, in
children forked from one process (`tests/forked.py`)."""

import os

import numpy as np
import pytest

from tests import forked
from tests.tools.test_show_batch import _cells  # The grid's images, read back.

pytestmark = pytest.mark.slow  # Two commands in forked children (~20 s).

# Posterize to 3 bits on about half the images, drawn from the example's seed.
POSTERIZE_SOME = '''"""posterize_some: Posterize to 3 bits on about half the images."""
from flax_dp_trainer.data.image import policy_records


def _apply(policy, image, seed):
  from flax_dp_trainer.data.image import op_records  # (TensorFlow: where the policy runs.)
  from flax_dp_trainer.data.tensorflow_import import tf
  keep = tf.random.stateless_uniform([], seed) < 0.5
  return tf.cond(keep, lambda: image, lambda: op_records.apply(image, 'Posterize', 3))


policy_records.REGISTRY.register(policy_records.Record(
    name='posterize_some', doc='Posterize to 3 bits on about half the images',
    library='torchvision', apply=_apply,
    describe=lambda policy: 'posterized to 3 bits on about half the images',
    interpolations=('nearest',), default_interpolation=lambda options: 'nearest'))
'''

USER = ['--config=default', '--config.imports=my_aug.posterize_some',
        '--config.auto_augment=posterize_some', '--config.batch_size=16']


@pytest.fixture(scope='module')
def answers(tmp_path_factory, tfds_data_dir):
  root = tmp_path_factory.mktemp('user_policy')
  forked.user_package(root, 'my_aug', {'posterize_some': POSTERIZE_SOME})
  data = f'--config.tfds_data_dir={tfds_data_dir}'
  outs = {case: str(root / f'{case}.png') for case in ('show', 'bad')}
  commands = {
      'show': ['flax_dp_trainer.tools.show_batch', *USER, data, f'--out={outs["show"]}'],
      'bad': ['flax_dp_trainer.tools.show_batch', *USER, data, f'--out={outs["bad"]}',
              '--config.auto_augment_interpolation=bilinear'],
  }
  results = forked.run([[str(root), *command] for command in commands.values()],
                       with_stdout=True)
  return dict(zip(commands, results)), outs


def test_show_batch_draws_a_users_policy_and_names_it(answers):
  status, stderr, stdout = answers[0]['show']
  assert status == 0, stderr[-3000:]
  assert 'preprocessing: posterized to 3 bits on about half the images, nearest, zeros' in (
      stdout), stdout
  # The 16 digits as the grid shows them: about half hold 3 bits' levels only.
  cells = _cells(answers[1]['show'], 16, 8, 8)
  posterized = [bool(np.all(cell % 32 == 0)) for cell in cells]
  assert 3 <= sum(posterized) <= 13, posterized


def test_a_setting_the_users_policy_cannot_take_is_one_line_and_status_2(answers):
  status, stderr, _ = answers[0]['bad']
  assert status == 2, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == (
      "error: auto_augment_interpolation='bilinear': torchvision's policy "
      "auto_augment='posterize_some' samples with one of nearest "
      "(--config.auto_augment_interpolation=NAME, or '' for its default)")
  assert not os.path.exists(answers[1]['bad'])
