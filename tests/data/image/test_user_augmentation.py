"""A user's augmentation from modules in `config.imports`, one file each, as docs/data.md
shows them: an op (`data.image.op_records`), a policy using it (`policy_records`) and a step
of the plan with a field of its own that the user's config file adds (`plan_steps`).
`show_batch` draws them in the run's own pipeline and its preprocessing line names them; a
value the policy or the step cannot take is refused in one line with status 2, before anything
is written. The commands run as a user runs them, in children forked from one process
(`tests/forked.py`)."""

import os
import pathlib
import re

import numpy as np
import pytest

from tests import REPO
from tests import forked
from tests.tools.test_show_batch import _cells  # The grid's images, read back.

pytestmark = pytest.mark.slow  # Four commands in forked children (~25 s).


def _docs_files() -> list[str]:
  """The op, the policy, the step and the config file as docs/data.md shows them."""
  text = pathlib.Path(REPO, 'docs', 'data.md').read_text()
  section = text.split('### Your own op, policy and plan step')[1].split('\n## ')[0]
  return re.findall(r'```python\n(.*?)```', section, re.S)


USER = ['--config=my_config.py', '--config.batch_size=16']
ON = ['--config.auto_augment=threshold_some', '--config.vflip_prob=0.5']


@pytest.fixture(scope='module')
def answers(tmp_path_factory, tfds_data_dir):
  root = tmp_path_factory.mktemp('user_augmentation')
  op, policy, step, config = _docs_files()
  forked.user_package(root, 'my_aug', {'threshold_op': op, 'threshold_some': policy,
                                       'vflip_step': step})
  (root / 'my_config.py').write_text(config)
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
