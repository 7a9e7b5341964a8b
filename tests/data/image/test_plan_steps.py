"""The training plan from its step records (`data.image.plan_steps`): the steps that are on,
in their order, and a field no step of the plan reads refused, with no refusal of a field a
step that is on reads (a timm string's sampling follows the training crop's filter). The
plans' outputs: `test_golden_digests.py`; the refusals as a run gives them:
tests/loop/test_bad_input.py."""

import dataclasses

import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.data import specs
from flax_dp_trainer.data.data_options import DataOptions
from flax_dp_trainer.data.image import plan_steps

SPEC = specs.DatasetSpec('test', 10, 3, (32, 32, 3), 100, augment='inception', image_size=24)


def test_the_plan_is_the_records_that_are_on_in_their_order():
  options = DataOptions(augment='inception', auto_augment='ta_wide', color_jitter=0.3,
                        random_erase_prob=0.25)
  plan = plan_steps.train_plan(options, SPEC, encoded=True)
  assert [step.name for step in plan.steps] == [
      'random-resized crop', 'flip', 'auto_augment', 'color jitter', 'random erasing']
  flat = dataclasses.replace(SPEC, augment='none', image_size=0)
  assert [s.name for s in plan_steps.train_plan(DataOptions(), flat, encoded=True).steps] == [
      'decode']
  assert not plan_steps.train_plan(DataOptions(), flat, encoded=False).steps


def test_a_field_is_refused_only_where_no_step_of_the_plan_reads_it():
  flat = dataclasses.replace(SPEC, augment='none', image_size=0)
  bicubic = DataOptions(train_interpolation='bicubic')
  with pytest.raises(UserError, match=r"^train_interpolation='bicubic' applies to the "
                     r"random-resized crop \(augment='inception'\)"):
    plan_steps.check_unread(bicubic, flat)
  # A timm string samples as the training crop's filter says: the policy reads it.
  plan_steps.check_unread(dataclasses.replace(bicubic, auto_augment='rand-m9'), flat)
  plan_steps.check_unread(bicubic, SPEC)
  plan_steps.check_unread(DataOptions(hflip_prob=0.0), SPEC)  # The flip off, as asked.
  assert [s.name for s in plan_steps.train_plan(DataOptions(hflip_prob=0.0), SPEC, True).steps] == [
      'random-resized crop']


def test_two_steps_on_one_random_stream_are_refused_and_a_steps_own_field_is_read(monkeypatch):
  """A user's step with a shipped step's stream would draw the same numbers as it (its flips
  would follow the flip's): refused in one line naming both. Its own field (a config file's)
  is read through `DataOptions.value`."""
  flip = plan_steps.REGISTRY.get('flip')
  records = {r.name: r for r in plan_steps.REGISTRY}
  records['mine'] = dataclasses.replace(
      flip, name='mine', order=36, on=lambda options, spec, encoded: options.value('mine_p') > 0,
      build=lambda options, spec, encoded: dataclasses.replace(
          flip.build(options, spec, encoded), prob=options.value('mine_p')),
      reads=(), own=(('mine_p', 0.0),), turned_on_by='set --config.mine_p')
  monkeypatch.setattr(plan_steps.REGISTRY, '_records', records)
  options = DataOptions(step_fields=(('mine_p', 0.3),))
  with pytest.raises(UserError, match=r"^the plan's steps 'flip' and 'flip' draw from one "):
    plan_steps.train_plan(options, SPEC, encoded=True)
  flat = dataclasses.replace(SPEC, augment='none', image_size=0)
  plan_steps.check_unread(options, flat)  # Its step is on: read.
  plan_steps.check_unread(DataOptions(step_fields=(('mine_p', 0.0),)), flat)
