"""The matrix of published recipes (`tools.recipe_matrix`): the scale-down of a command, and
what counts as the expected verdict (its recorded run is in docs/recipes.md, not here)."""

import dataclasses

import pytest

from flax_dp_trainer.tools import recipe_matrix


def test_the_scale_down_replaces_the_commands_values_and_adds_the_rest():
  argv = ('--model', 'resnet50', '--batch-size', '128', '--epochs', '600', '--model-ema',
          '--lr', '0.5')
  scaled = recipe_matrix.scale(argv, ('--batch-size', '8', '--epochs', '4',
                                      '--lr-warmup-epochs', '1'))
  assert scaled == ['--model', 'resnet50', '--model-ema', '--lr', '0.5', '--batch-size', '8',
                    '--epochs', '4', '--lr-warmup-epochs', '1']


def test_every_recipe_scales_the_batch_and_names_a_fault_field():
  names = [r.name for r in recipe_matrix.RECIPES]
  assert len(set(names)) == len(names) == 9
  for recipe in recipe_matrix.RECIPES:
    scaled = recipe_matrix.scale(recipe.argv, recipe.scaled)
    assert scaled[scaled.index('--batch-size') + 1] in ('2', '8', '16'), recipe.name
    field, eq, value = recipe.fault.partition('=')
    assert eq and field and value, recipe.fault


def test_the_learning_rate_scales_with_the_batch_by_timms_rule():
  """Linearly for SGD, by the square root for an adaptive optimizer; timm's --lr-base rule,
  where the command gives no --lr, scales it itself."""
  by_name = {r.name: r for r in recipe_matrix.RECIPES}
  # torchvision's default 0.1 for 8 x 32, at 2 x 8.
  assert recipe_matrix.learning_rate_flags(by_name['tv-resnet50-v1']) == ('--lr', '0.00625')
  # AdamW's 0.003 for 8 x 512, at 4 x 2: x sqrt(8 / 4096).
  assert recipe_matrix.learning_rate_flags(by_name['tv-vit_b_16']) == ('--lr', '0.0001326')
  bare = dataclasses.replace(by_name['timm-vit_s-no-drop-path'], argv=('--opt', 'adamw'))
  assert not recipe_matrix.learning_rate_flags(bare)


def _run(status, verdict='', left=(), traceback=False):
  return recipe_matrix.Run(status, 1.0, verdict, list(left), traceback, '2.0 x rounding')


@pytest.mark.parametrize('seeds, fault, full, ok', [
    ([0, 0, 0], 'verdict: they part in the settings, at "loss settings" (x): y', 0, True),
    ([0, 1, 0], 'verdict: they part in the settings, at "loss settings" (x): y', 0, False),
    ([0, 0, 0], 'verdict: they part at step 3, at "gradients" (w): y', 0, False),
    ([0, 0, 0], 'verdict: the same recipe: ...', 0, False),
    ([0, 0, 0], 'verdict: they part in the settings, at "loss settings" (x): y', 2, False),
])
def test_a_verdict_is_expected_only_where_seeds_agree_and_the_fault_parts_at_its_stage(
    seeds, fault, full, ok):
  recipe = next(r for r in recipe_matrix.RECIPES if r.fault_stage == 'loss settings')
  result = dict(recipe=recipe, full=_run(full), written=_run(0), scaled=[],
                seeds={s: _run(code, 'verdict: ...') for s, code in enumerate(seeds, 1)},
                fault=_run(0 if 'same' in fault else 1, fault))
  assert recipe_matrix.expected(result) == ok
  row = recipe_matrix.table([result], [1, 2, 3], 36).splitlines()[1]
  assert row.startswith(recipe.name) and row.endswith('yes' if ok else 'NO')
