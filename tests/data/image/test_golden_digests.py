"""Every op, policy and plan step bitwise what it was (`golden.py`): the outputs of about a
thousand cases (each op of torchvision's and timm's arithmetic at values on both sides of
its range, each policy and plan by the config values that choose it, on RGB and greyscale
images), hashed and compared with the digests recorded before the augmentation side became
records. A case whose output changes is named, as is a case added or gone (every recorded
case is in one group)."""

import json

import pytest

from tests.data.image import golden


# The plan's cases run whole pipelines (some 10 s on 2 cores): the slow tier's.
@pytest.mark.parametrize('group', [pytest.param(g, marks=pytest.mark.slow) if g == 'plan'
                                   else g for g in golden.GROUPS])
def test_every_op_policy_and_plan_gives_its_recorded_output(group):
  recorded = {name: value for name, value in
              json.loads(golden.DIGESTS.read_text(encoding='utf-8')).items()
              if name.startswith(group + ' ')}
  found = golden.digests(group)
  assert sorted(found) == sorted(recorded), (
      f'cases gone: {sorted(set(recorded) - set(found))[:10]}; '
      f'new: {sorted(set(found) - set(recorded))[:10]}')
  changed = [name for name in recorded if found[name] != recorded[name]]
  assert not changed, f'{len(changed)} of {len(recorded)} outputs changed: {changed[:20]}'


def test_every_recorded_case_is_in_a_group():
  recorded = json.loads(golden.DIGESTS.read_text(encoding='utf-8'))
  assert all(name.startswith(tuple(g + ' ' for g in golden.GROUPS)) for name in recorded)
  assert set(recorded) == set(golden.cases())
