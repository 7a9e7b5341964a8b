"""A user's augmentation from modules in `config.imports`, one file each: an op
(`data.image.op_records`), a policy using it (`policy_records`) and a step of the plan with a
field of its own that the user's config file adds (`plan_steps`). `show_batch` draws them in
the run's own pipeline and its preprocessing line names them; a value the policy or the step
cannot take is refused in one line with status 2, before anything is written. The commands run
as a user runs them, in children forked from one process (`tests/forked.py`)."""

import os

import numpy as np
import pytest

from tests import forked
from tests.tools.test_show_batch import _cells  # The grid's images, read back.

pytestmark = pytest.mark.slow  # Four commands in forked children (~25 s).

THRESHOLD_OP = '''"""Threshold: each pixel to 255 where it is at least 255 m, else to 0."""
from flax_dp_trainer.data.image import op_records
from flax_dp_trainer.data.tensorflow_import import tf

op_records.REGISTRY.register(op_records.Record(
    name='Threshold', doc='each pixel to 255 from 255 m up, else to 0',
    tensor=lambda x, m, quantize, interpolation, fill: tf.where(
        x >= tf.cast(255.0 * m, tf.float32), 255.0, 0.0)))
'''

THRESHOLD_SOME = '''"""threshold_some: the op Threshold at 0.5 on about half the images."""
from flax_dp_trainer.data.image import policy_records


def _apply(policy, image, seed):
  from flax_dp_trainer.data.image import op_records  # (TensorFlow: where the policy runs.)
  from flax_dp_trainer.data.tensorflow_import import tf
  keep = tf.random.stateless_uniform([], seed) < 0.5
  return tf.cond(keep, lambda: image, lambda: op_records.apply(image, 'Threshold', 0.5))


policy_records.REGISTRY.register(policy_records.Record(
    name='threshold_some', doc='Threshold at 0.5 on about half the images',
    library='torchvision', apply=_apply,
    describe=lambda policy: 'thresholded at 0.5 on about half the images',
    interpolations=('nearest',), default_interpolation=lambda options: 'nearest'))
'''

VFLIP_STEP = '''"""vflip: the vertical flip with probability vflip_prob (a field of its own)."""
import dataclasses

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data.image import plan_steps
from flax_dp_trainer.data.image import preprocess
from flax_dp_trainer.data.tensorflow_import import tf


@dataclasses.dataclass(frozen=True)
class RandomVerticalFlip(preprocess.Step):
  name = 'vertical flip'
  stream: int = 100  # A random stream no shipped step uses.
  prob: float = 0.5

  def __call__(self, image, seed):
    flip = tf.random.stateless_uniform([], seed) < self.prob
    return tf.cond(flip, lambda: tf.reverse(image, [0]), lambda: image)

  def describe(self):
    return f'vertical flip (p={self.prob})'


def _check(options):
  prob = options.value('vflip_prob')
  if not 0 <= prob <= 1:
    raise UserError(f'vflip_prob={prob!r} must be a probability in [0, 1] '
                    '(--config.vflip_prob=0.5)')


plan_steps.REGISTRY.register(plan_steps.Record(
    name='vflip', doc='the vertical flip', order=35,
    on=lambda options, spec, encoded: options.value('vflip_prob') != 0,
    build=lambda options, spec, encoded: RandomVerticalFlip(prob=options.value('vflip_prob')),
    own=(('vflip_prob', 0.0),), check=_check))
'''

CONFIG = '''from flax_dp_trainer.configs import default


def get_config():
  config = default.get_config()
  config.imports = 'my_aug.threshold_op,my_aug.threshold_some,my_aug.vflip_step'
  with config.unlocked():  # A field of the user's step's own.
    config.vflip_prob = 0.0
  return config
'''

USER = ['--config=my_config.py', '--config.batch_size=16']
ON = ['--config.auto_augment=threshold_some', '--config.vflip_prob=0.5']


@pytest.fixture(scope='module')
def answers(tmp_path_factory, tfds_data_dir):
  root = tmp_path_factory.mktemp('user_augmentation')
  forked.user_package(root, 'my_aug', {'threshold_op': THRESHOLD_OP,
                                       'threshold_some': THRESHOLD_SOME,
                                       'vflip_step': VFLIP_STEP})
  (root / 'my_config.py').write_text(CONFIG)
  data = f'--config.tfds_data_dir={tfds_data_dir}'
  cases = {'plain': [], 'show': ON,
           'bad_policy': [*ON, '--config.auto_augment_interpolation=bilinear'],
           'bad_step': ['--config.vflip_prob=1.5']}
  outs = {case: str(root / f'{case}.png') for case in cases}
  commands = [[str(root), 'flax_dp_trainer.tools.show_batch', *USER, data,
               f'--out={outs[case]}', *extra] for case, extra in cases.items()]
  results = forked.run(commands, with_stdout=True)
  return dict(zip(cases, results)), outs


def test_show_batch_draws_a_users_op_policy_and_step_and_names_them(answers):
  for case in ('plain', 'show'):
    status, stderr, _ = answers[0][case]
    assert status == 0, stderr[-3000:]
  stdout = answers[0]['show'][2]
  assert 'vertical flip (p=0.5) -> thresholded at 0.5 on about half the images, nearest, ' \
         'zeros' in stdout, stdout
  # The 16 digits as the grid shows them against the same stream without the two: each is the
  # plain one, thresholded or not, flipped upside down or not; some of each.
  plain = _cells(answers[1]['plain'], 16, 8, 8)
  shown = _cells(answers[1]['show'], 16, 8, 8)
  thresholded, flipped = [], []
  for before, after in zip(plain, shown):
    forms = {(t, f): np.flipud(b) if f else b
             for t in (False, True) for f in (False, True)
             for b in [np.where(before >= 128, 255, 0) if t else before]}
    found = [form for form, image in forms.items() if np.array_equal(image, after)]
    assert found, (before, after)
    thresholded.append(found[0][0])
    flipped.append(found[0][1])
  assert 3 <= sum(thresholded) <= 13 and 3 <= sum(flipped) <= 13, (thresholded, flipped)


@pytest.mark.parametrize('case, line', [
    ('bad_policy', "error: auto_augment_interpolation='bilinear': torchvision's policy "
                   "auto_augment='threshold_some' samples with one of nearest "
                   "(--config.auto_augment_interpolation=NAME, or '' for its default)"),
    ('bad_step', 'error: vflip_prob=1.5 must be a probability in [0, 1] '
                 '(--config.vflip_prob=0.5)'),
])
def test_a_value_the_users_policy_or_step_cannot_take_is_one_line_and_status_2(
    answers, case, line):
  status, stderr, _ = answers[0][case]
  assert status == 2, stderr[-3000:]
  assert stderr.strip().splitlines()[-1] == line
  assert not os.path.exists(answers[1][case])
