"""A translation of timm's `train.py` command under way (`Context`: the parsed command line,
the processes, the model's facts read from timm's registry, the Translation being filled),
and timm's constants the translation reads."""

import dataclasses
from typing import Any, Optional

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.pytorch.recipe import timm_args
from flax_dp_trainer.pytorch.recipe.translation import Translation

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # timm's IMAGENET_DEFAULT_MEAN.
IMAGENET_STD = (0.229, 0.224, 0.225)  # timm's IMAGENET_DEFAULT_STD.
DEFAULT_CROP_PCT = 0.875  # timm's DEFAULT_CROP_PCT.
# The names timm's folder datasets look for where the split's own folder is missing.
TRAIN_SYNONYMS = ('train', 'training')
EVAL_SYNONYMS = ('val', 'valid', 'validation', 'eval', 'evaluation')
# `no_weight_decay()` names this trainer spares too (position embeddings and class tokens).
SPARED_NAMES = frozenset({'pos_embed', 'cls_token', 'dist_token', 'reg_token'})


@dataclasses.dataclass(frozen=True)
class TimmModel:
  """What the script reads from its model: timm's pretrained config of `name` (the data
  config's defaults) and the model built without weights (its layers)."""
  name: str
  entrypoint: str  # 'timm.models.deit:deit_small_patch16_224', for config.torch_model.
  input_size: tuple  # (channels, height, width)
  fixed_input_size: bool  # Built for one size: the script hands it the requested one.
  interpolation: str
  mean: tuple
  std: tuple
  crop_pct: float
  num_classes: int
  has_batchnorm: Optional[bool]  # None: the model could not be built to look.
  no_weight_decay: frozenset  # Its `no_weight_decay()` names.


def timm_model(name: str) -> Optional[TimmModel]:
  """timm's facts about model `name`, or None where timm (or torch) does not import here;
  UserError where timm has no such model (the script stops there too)."""
  try:
    # pylint: disable=import-outside-toplevel  # (the ddp extra, only once translating)
    import timm
    import torch
  except ImportError:
    return None
  if not timm.models.is_model(name):
    close = timm.list_models(f'*{name[:6]}*')[:3]
    hint = f' (e.g. {", ".join(close)})' if close else ''
    raise UserError(f'--model {name}: timm {timm.__version__} has no such model{hint}')
  cfg = timm.models.get_pretrained_cfg(name)
  cfg = cfg.to_dict() if cfg is not None else {}
  entry = timm.models.model_entrypoint(name)
  has_batchnorm, no_decay = None, frozenset()
  try:
    with torch.device('meta'):  # Its layers, without memory or an init.
      built = timm.create_model(name, pretrained=False)
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d,
             torch.nn.SyncBatchNorm)
    # timm's own BatchNorm layers (BatchNormAct2d, ...) subclass torch's.
    has_batchnorm = any(isinstance(m, norms) for m in built.modules())
    no_decay = frozenset(getattr(built, 'no_weight_decay', lambda: ())())
  except Exception:  # pylint: disable=broad-except  # Some models refuse the meta device.
    pass
  return TimmModel(
      name=name, entrypoint=f'{entry.__module__}:{entry.__name__}',
      input_size=tuple(cfg.get('input_size') or (3, 224, 224)),
      fixed_input_size=bool(cfg.get('fixed_input_size', False)),
      interpolation=cfg.get('interpolation') or 'bicubic',
      mean=tuple(cfg.get('mean') or IMAGENET_MEAN), std=tuple(cfg.get('std') or IMAGENET_STD),
      crop_pct=cfg.get('crop_pct') or DEFAULT_CROP_PCT,
      num_classes=cfg.get('num_classes') or 1000, has_batchnorm=has_batchnorm,
      no_weight_decay=no_decay)


def _shown(value: Any) -> str:
  """A flag's value as it is written on a command line."""
  if isinstance(value, bool):
    return '' if value else 'unset'
  if isinstance(value, (list, tuple)):
    return ' '.join(_shown(v) for v in value)
  if isinstance(value, dict):
    return ' '.join(f'{k}={v!r}' for k, v in value.items())
  return repr(value) if isinstance(value, str) and not value else str(value)


@dataclasses.dataclass
class Context:
  """One translation under way: the parsed command line, the processes, the model's facts
  and the Translation being filled."""
  parsed: timm_args.Parsed
  nproc: int
  out: Translation
  model: Optional[TimmModel]
  options: dict  # dest -> its flag.
  train_dir: Optional[str] = None  # The training images' folder, where it is here to count.

  @property
  def args(self):
    return self.parsed.args

  def changed(self, dest: str) -> bool:
    """Whether `dest` differs from the script's own default."""
    return getattr(self.args, dest) != self.parsed.defaults[dest]

  def flag(self, *dests: str) -> str:
    """'--opt adamw' for a flag given, '(default) --lr None' for the script's default,
    '(deit.yaml) --epochs 300' for a config file's; several joined by ', '."""
    parts = []
    for dest in dests:
      if dest in self.parsed.given:
        origin = ''
      elif dest in self.parsed.from_config:
        origin = f'({timm_args.config_name(self.parsed)}) '
      else:
        origin = '(default) '
      value = _shown(getattr(self.args, dest))
      parts.append(f'{origin}{self.options[dest]}{" " + value if value else ""}')
    return ', '.join(parts)

  def set(self, dests, field: str, value: Any, note: str = '') -> None:
    dests = (dests,) if isinstance(dests, str) else dests
    self.out.set(self.flag(*dests), field, value, note)

  def refuse(self, dest: str, reason: str, changes_training: bool = True) -> None:
    self.out.refuse(self.flag(dest), reason, changes_training)
