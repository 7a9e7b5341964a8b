"""Each optimizer record's PyTorch counterpart, by the record's name: the class that runs the
same algorithm (torch.optim or timm.optim) with its keyword arguments from ours, which the DDP
twin builds, and the `--opt` names timm's and torchvision's scripts give it, which their
translators read. A user's optimizer record may register its own (`REGISTRY.register`); one
without is said to have none.
"""

import dataclasses
from collections.abc import Mapping
from typing import Callable, Optional

from flax_dp_trainer.base import registry
from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.step import optimizers


@dataclasses.dataclass(frozen=True)
class TimmForm:
  """How timm's `create_optimizer_v2` builds the counterpart under one `--opt` name, for the
  translator of timm's commands (`recipe/timm_optimization.py`)."""
  timm_class: str = ''  # What timm builds, for the row's note.
  eps: Optional[float] = None  # Its default eps where timm passes --opt-eps; None: dropped.
  betas: str = ''  # Where --opt-betas go: 'fields' (adam_b1/b2), 'kwargs' (b1, b2), 'b1'; ''
  # where timm drops them.
  default_betas: Optional[tuple] = None
  momentum: bool = False  # Takes --momentum (timm sets it for optimizers that have one).
  nesterov: Optional[bool] = None  # config.nesterov, where it takes one.
  kwargs: tuple = ()  # Fixed optimizer_kwargs: timm's defaults where they differ from ours.
  refused: str = ''  # Why timm's optimizer of this name does not translate to the record.


@dataclasses.dataclass(frozen=True)
class TorchvisionForm:
  """How torchvision's `references/classification/train.py` builds the counterpart under one
  `--opt` name (lowercased), for its translator (`recipe/from_torchvision.py`)."""
  torch_class: str  # What the script builds, for the row's note.
  prefix: bool = False  # Any name that begins with this one (the script's `sgd*`).
  nesterov_in_name: bool = False  # Nesterov where the name holds 'nesterov' (sgd_nesterov).
  momentum: bool = False  # Takes --momentum.
  kwargs: tuple = ()  # Fixed optimizer_kwargs: the script's arguments to the class.
  fields: tuple = ()  # (field, value, note) the script's construction fixes.


@dataclasses.dataclass(frozen=True)
class Counterpart:
  """One optimizer record's counterpart. `torch_class`: the PyTorch class that runs the same
  algorithm ('torch.optim.SGD', 'timm.optim.Lion'); `to_torch`: its keyword arguments (torch's
  names) from the record's resolved ones, lr and weight_decay aside (those go per parameter
  group); `timm` and `torchvision`: the scripts' forms by `--opt` name."""
  name: str  # The optimizer record's.
  torch_class: str = ''
  to_torch: Optional[Callable[[dict], dict]] = None
  timm: Mapping[str, TimmForm] = dataclasses.field(default_factory=dict)
  torchvision: Mapping[str, TorchvisionForm] = dataclasses.field(default_factory=dict)


REGISTRY: registry.Registry[Counterpart] = registry.Registry('optimizer counterpart')


def _betas(o: dict) -> dict:
  """torch's `betas` from our b1, b2, and eps."""
  return dict(betas=(o['b1'], o['b2']), eps=o['eps'])


def _muon(o: dict) -> dict:
  # (ns_dtype: timm's orthogonalization takes it per call; the twin passes it there.)
  coefficients = o['ns_coefficients']
  return dict(
      momentum=o['momentum'], nesterov=o['nesterov'], ns_steps=o['ns_steps'],
      ns_coefficients=coefficients if isinstance(coefficients, str) else [
          list(t) for t in optimizers.muon_ns_coefficients(coefficients)],
      eps=o['eps'], safety_factor=o['safety_factor'], adjust_lr_fn=o['adjust_lr_fn'],
      conv_mode='flatten', fallback_lr_scale=o['fallback_lr_scale'], betas=(o['b1'], o['b2']))


_SGDW = TimmForm('timm.optim.SGDW, Nesterov', momentum=True, nesterov=True)
for _shipped in (
    Counterpart(
        # (timm reads only betas[0]; the second is a placeholder.)
        'adafactor', 'timm.optim.Adafactor', lambda o: dict(
            betas=None if o['b1'] is None else (o['b1'], 0.0), eps=o['eps'],
            clip_threshold=o['clip_threshold'], decay_rate=o['decay_rate'],
            min_dim_size_to_factor=o['min_dim_size_to_factor']),
        timm={'adafactor': TimmForm('timm.optim.Adafactor, the rate given', 1e-30, 'b1')}),
    Counterpart('adam', 'torch.optim.Adam', _betas,
                timm={'adam': TimmForm('torch.optim.Adam', 1e-8, 'fields', (0.9, 0.999))}),
    Counterpart(
        'adamw', 'torch.optim.AdamW', _betas,
        timm={'adamw': TimmForm('torch.optim.AdamW', 1e-8, 'fields', (0.9, 0.999))},
        torchvision={'adamw': TorchvisionForm(
            'torch.optim.AdamW, decoupled decay',
            fields=(('adam_b1', 0.9, "AdamW's default betas"),
                    ('adam_b2', 0.999, "AdamW's default betas")))}),
    Counterpart(
        'lamb', 'timm.optim.Lamb', lambda o: dict(
            betas=(o['b1'], o['b2']), eps=o['eps'], bias_correction=True, grad_averaging=True,
            max_grad_norm=o['max_grad_norm'], trust_clip=False, always_adapt=o['always_adapt'],
            decoupled_decay=False),
        timm={'lamb': TimmForm('timm.optim.Lamb', 1e-6, 'fields', (0.9, 0.999), kwargs=(
            ('always_adapt', False), ('max_grad_norm', 1.0)))}),
    Counterpart(
        'lars', 'timm.optim.Lars', lambda o: dict(
            momentum=o['momentum'], nesterov=o['nesterov'], trust_coeff=o['trust_coeff'],
            eps=o['eps'], trust_clip=False, always_adapt=o['always_adapt']),
        timm={'lars': TimmForm('timm.optim.Lars', 1e-8, momentum=True, nesterov=False),
              'nlars': TimmForm('timm.optim.Lars, Nesterov', 1e-8, momentum=True,
                                nesterov=True)}),
    Counterpart('lion', 'timm.optim.Lion', lambda o: dict(betas=(o['b1'], o['b2'])),
                timm={'lion': TimmForm('timm.optim.Lion', None, 'kwargs', (0.9, 0.99))}),
    Counterpart(
        'muon', 'timm.optim.Muon', _muon,
        timm={'muon': TimmForm(refused="timm's Muon orthogonalizes the head and the embeddings "
                                       'too; muon here routes them to its AdamW fallback')}),
    Counterpart('nadamw', 'timm.optim.NAdamW', _betas,
                timm={'nadamw': TimmForm('timm.optim.NAdamW', 1e-8, 'fields', (0.9, 0.999))}),
    Counterpart(
        'rmsprop', 'torch.optim.RMSprop', lambda o: dict(
            alpha=o['alpha'], eps=o['eps'], momentum=o['momentum'], centered=o['centered']),
        timm={'rmsprop': TimmForm('torch.optim.RMSprop(alpha=0.9)', 1e-8, momentum=True,
                                  kwargs=(('alpha', 0.9),))},
        torchvision={'rmsprop': TorchvisionForm(
            'torch.optim.RMSprop', momentum=True, kwargs=(('alpha', 0.9), ('eps', 0.0316)))}),
    Counterpart(
        'sgd', 'torch.optim.SGD', lambda o: dict(momentum=o['momentum'], nesterov=o['nesterov']),
        timm={'sgd': TimmForm('torch.optim.SGD, Nesterov', momentum=True, nesterov=True),
              'momentum': TimmForm('torch.optim.SGD', momentum=True, nesterov=False)},
        torchvision={'sgd': TorchvisionForm('torch.optim.SGD', prefix=True,
                                            nesterov_in_name=True, momentum=True)}),
    Counterpart('sgdw', 'timm.optim.SGDW',
                lambda o: dict(momentum=o['momentum'], nesterov=o['nesterov']),
                timm={'sgdw': _SGDW, 'nesterovw': _SGDW}),
):
  REGISTRY.register(_shipped)


def of(name: str) -> Counterpart:
  """The counterpart of the optimizer `name`: its registered one, else one that has none (an
  optax optimizer, a user's record without one)."""
  return REGISTRY.get(name) if name in REGISTRY else Counterpart(name)


def counterpart(optimizer: optimizers.Optimizer) -> tuple[str, dict]:
  """The PyTorch class ('torch.optim.SGD', 'timm.optim.Lion', ...) that runs the same algorithm
  and its keyword arguments (torch's names) other than lr and weight_decay (those go per
  parameter group). UserError, one line, where the record has none (an optax optimizer)."""
  found = of(optimizer.name)
  if not found.torch_class:
    raise UserError(f'optimizer={optimizer.name!r} has no PyTorch counterpart, so the DDP twin '
                    'cannot run it; compare with a shipped one (--config.optimizer=adamw) or '
                    'skip the twin (tools.compare)')
  return found.torch_class, found.to_torch(optimizer.options)


def describe(optimizer: optimizers.Optimizer) -> str:
  """One line for people: the optimizer (`optimizers.describe`) and the PyTorch class it
  equals, e.g. 'adamw(b1=0.9, b2=0.999, eps=1e-08), decoupled weight decay 0.05 =
  torch.optim.AdamW(betas=(0.9, 0.999), eps=1e-08)'."""
  line = optimizers.describe(optimizer)
  if not of(optimizer.name).torch_class:
    return f'{line} (no PyTorch counterpart)'
  class_name, theirs = counterpart(optimizer)
  return f'{line} = {class_name}({optimizers.shown(theirs)})'
