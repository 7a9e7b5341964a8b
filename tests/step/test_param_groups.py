"""Per-parameter groups: timm's layer-wise decay and weight-decay exclusions on the zoo's ViT
against `timm.optim.param_groups_layer_decay` on timm's own, big_vision's factors,
torchvision's decays, freezing, and `--show_param_groups`."""

import re

import jax
import numpy as np
import optax
import pytest

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.configs import default
from flax_dp_trainer.edge import reading as run_options
from flax_dp_trainer.model import blocks
from flax_dp_trainer.step import optim
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.step import schedules

SHAPE = (1, 32, 32, 3)


def _model(name, **fields):
  config = default.get_config()
  config.model = name
  config.update(**fields)
  model = run_options.model_of(config, 10, SHAPE)
  return config, model, *blocks.call_order(model, SHAPE)


# The zoo's ViT modules and timm's (vision_transformer.py) for the same parameters.
_TIMM_NAMES = [
    (r'embedding/(kernel|bias)', lambda m: f'patch_embed.proj.{_W[m[1]]}'),
    (r'cls', lambda m: 'cls_token'), (r'pos_embedding', lambda m: 'pos_embed'),
    (r'encoderblock_(\d+)/LayerNorm_(\d)/(scale|bias)',
     lambda m: f'blocks.{m[1]}.norm{int(m[2]) + 1}.{_W[m[3]]}'),
    (r'encoderblock_(\d+)/MultiHeadDotProductAttention_0/(query|key|value)/(kernel|bias)',
     lambda m: f'blocks.{m[1]}.attn.qkv.{_W[m[3]]}'),
    (r'encoderblock_(\d+)/MultiHeadDotProductAttention_0/out/(kernel|bias)',
     lambda m: f'blocks.{m[1]}.attn.proj.{_W[m[2]]}'),
    (r'encoderblock_(\d+)/MlpBlock_0/Dense_(\d)/(kernel|bias)',
     lambda m: f'blocks.{m[1]}.mlp.fc{int(m[2]) + 1}.{_W[m[3]]}'),
    (r'encoderblock_(\d+)/Dense_(\d)/(kernel|bias)',
     lambda m: f'blocks.{m[1]}.mlp.fc{int(m[2]) + 1}.{_W[m[3]]}'),
    (r'encoder_norm/(scale|bias)', lambda m: f'norm.{_W[m[1]]}'),
    (r'head/(kernel|bias)', lambda m: f'head.{_W[m[1]]}'),
]
_W = {'kernel': 'weight', 'scale': 'weight', 'bias': 'bias'}


def _timm_name(path: str) -> str:
  for pattern, name in _TIMM_NAMES:
    match = re.fullmatch(pattern, path)
    if match:
      return name(match)
  raise AssertionError(f'no timm name for {path}')


def test_layer_decay_and_weight_decay_are_timms_on_the_vit():
  """Every leaf of the zoo's ViT-Ti/16 takes the lr scale and weight decay that timm's
  param_groups_layer_decay gives the same parameter of timm's ViT-Ti/16 (its no_weight_decay()
  list included); the scanned form takes them per slice of each stacked leaf."""
  timm = pytest.importorskip('timm')
  from timm.optim import _param_groups  # pylint: disable=import-outside-toplevel
  reference = timm.create_model('vit_tiny_patch16_224', pretrained=False, num_classes=10,
                                img_size=32)
  names = {id(p): n for n, p in reference.named_parameters()}
  theirs = {}
  for group in _param_groups.param_groups_layer_decay(
      reference, weight_decay=0.05, no_weight_decay_list=reference.no_weight_decay(),
      layer_decay=0.65):
    for p in group['params']:
      theirs[names[id(p)]] = (group['lr_scale'], group['weight_decay'])
  config, _, order, params = _model('vit_ti16', layer_decay=0.65, weight_decay=0.05)
  groups = run_options.group_options(config, order)
  ours = param_groups.groups(groups, params)
  assert [g.path for g in ours] == list(order)  # In call order: the table's.
  covered = set()
  for g in ours:
    name = _timm_name(g.path)
    covered.add(name)
    np.testing.assert_allclose(g.lr_mult, theirs[name][0], rtol=1e-12, err_msg=g.path)
    assert g.wd_mult * 0.05 == theirs[name][1], g.path
  assert covered == set(theirs)
  # 0.65^13 for the stem, 0.65^(12 - k) for block k (the final norm with the last, as timm
  # groups it), 1 for the head.
  by_path = {g.path: g for g in ours}
  assert by_path['embedding/kernel'].lr_mult == pytest.approx(0.65 ** 13)
  assert by_path['encoderblock_4/LayerNorm_0/scale'].lr_mult == pytest.approx(0.65 ** 8)
  assert by_path['encoder_norm/scale'].lr_mult == pytest.approx(0.65)
  assert by_path['head/kernel'].lr_mult == 1.0

  config, _, order, stacked = _model('vit_ti16', layer_decay=0.65, scan_layers=True)
  factors = param_groups.lr_factors(run_options.group_options(config, order))(stacked)
  kernel = np.asarray(factors['encoderblock']['MlpBlock_0']['Dense_0']['kernel']
                      if 'MlpBlock_0' in factors['encoderblock']
                      else factors['encoderblock']['Dense_0']['kernel'])
  np.testing.assert_allclose(kernel.reshape(-1), [0.65 ** (12 - k) for k in range(12)],
                             rtol=1e-6)


def test_factors_decays_and_freezing_by_path():
  """big_vision's REGEX=FACTOR lists (the first match decides, a comma inside a regex kept),
  torchvision's decays of norm params and biases, and frozen leaves that take no update and
  keep no optimizer state."""
  assert param_groups.parse_factors('head/.*=10,a{1,2}=0.5', 'lr_mults') == (
      ('head/.*', 10.0), ('a{1,2}', 0.5))
  with pytest.raises(UserError, match="each entry is REGEX=FACTOR"):
    param_groups.parse_factors('head/.*', 'lr_mults')
  config, _, order, params = _model('resnet18', lr_mults='Dense_0/.*=10,.*=0.5',
                                    wd_mults='BasicBlock_0/.*=3', norm_weight_decay=0.0,
                                    bias_weight_decay=1e-3, weight_decay=1e-2)
  by_path = {g.path: g for g in param_groups.groups(run_options.group_options(config, order),
                                                    params)}
  assert by_path['Dense_0/kernel'].lr_mult == 10.0
  assert by_path['conv_init/kernel'].lr_mult == 0.5
  assert by_path['BasicBlock_0/Conv_0/kernel'].wd_mult == 3.0  # wd_mults over the rule.
  assert by_path['BasicBlock_1/Conv_0/kernel'].wd_mult == 1.0
  assert by_path['bn_init/scale'].wd_mult == 0.0  # norm_weight_decay=0
  assert by_path['Dense_0/bias'].wd_mult == pytest.approx(0.1)  # 1e-3 / 1e-2

  config, _, order, params = _model('cnn', frozen='(?!Dense_1/).*', warmup_steps=0)
  options = run_options.optim_options(config)
  options = optim.OptimOptions(options.optimizer, options.schedule,
                               run_options.group_options(config, order))
  tx = optim.create_optimizer(options, schedules.learning_rate_schedule(options.schedule))
  real = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), params)
  state = tx.init(real)
  kept = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
  assert any('Dense_1' in path for path in kept)
  assert not any(name in path for path in kept for name in ('Conv_0', 'Conv_1', 'Dense_0'))
  updates, _ = tx.update(jax.tree.map(np.ones_like, real), state, real)
  assert not np.any(np.asarray(updates['Conv_0']['kernel']))
  assert np.all(np.asarray(updates['Dense_1']['kernel']) != 0)
  assert float(optax.global_norm(updates['Dense_0'])) == 0.0


def test_a_pattern_that_matches_nothing_or_everything_is_refused():
  config, _, order, params = _model('cnn', wd_mults='head/.*=0')
  with pytest.raises(UserError, match=r"wd_mults: the regex 'head/\.\*' matches no parameter"):
    param_groups.check_params(run_options.group_options(config, order), params)
  config, _, order, params = _model('cnn', frozen='.*')
  with pytest.raises(UserError, match='freezes every parameter'):
    param_groups.check_params(run_options.group_options(config, order), params)
  with pytest.raises(UserError, match=r'layer_decay=0 is outside \(0, 1\]'):
    param_groups.check_patterns(param_groups.GroupOptions(layer_decay=0))
  with pytest.raises(UserError, match='does not compile'):
    param_groups.check_patterns(param_groups.GroupOptions(frozen='(('))


def test_show_param_groups_lists_each_parameter_before_anything_compiles():
  """The table of `--show_param_groups` (the flag prints it): the ViT's patch embedding at
  0.65^13 of the head's rate, block k at 0.65^(12 - k), biases and the class token spared."""
  from flax_dp_trainer import settings  # pylint: disable=import-outside-toplevel
  config = default.get_config()
  config.update(model='vit_ti16', layer_decay=0.65)
  rows = {line.split()[0]: line.split()[1:] for line in
          settings.show_param_groups(config).splitlines()[2:-1]}
  assert rows['embedding/kernel'][1:4] == ['0', f'{0.65 ** 13:.4g}', '1']
  assert rows['cls'][1:4] == ['0', f'{0.65 ** 13:.4g}', '0']
  for k in (0, 5, 11):
    assert rows[f'encoderblock_{k}/LayerNorm_0/scale'][1:3] == [str(k + 1),
                                                                f'{0.65 ** (12 - k):.4g}']
  assert rows['encoderblock_0/MultiHeadDotProductAttention_0/query/bias'][3] == '0'
  assert rows['head/kernel'][1:4] == ['13', '1', '1']
