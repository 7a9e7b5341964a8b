"""The optimizer and its learning-rate schedule (optax), from `OptimOptions`: the config's
optimization fields with the durations in steps and the learning rate scaled (the loop's
setup resolves them: `loop.options`)."""

import dataclasses

import jax
import optax

from flax_dp_trainer.base.errors import UserError
from flax_dp_trainer.model import params as model_params

OPTIMIZERS = ('adamw', 'lamb', 'lars', 'sgd')


@dataclasses.dataclass(frozen=True)
class OptimOptions:
  """What the optimizer and its schedule are (the config fields of the same names)."""
  optimizer: str = 'sgd'  # One of OPTIMIZERS.
  peak_learning_rate: float = 0.1  # After the linear scaling rule, where the config asks it.
  end_learning_rate_factor: float = 0.0  # The cosine decay's end, as a fraction of the peak.
  warmup_steps: int = 0  # Linear warm-up from 0 to the peak, in steps.
  num_train_steps: int = 1  # The cosine decay ends here.
  weight_decay: float = 0.0
  decay_all_params: bool = False  # Else kernels only (`decay_mask`).
  momentum: float = 0.9  # sgd, lars.
  nesterov: bool = False  # sgd, lars.
  adam_b1: float = 0.9  # adamw, lamb.
  adam_b2: float = 0.999  # adamw, lamb.
  grad_clip_norm: float = 0.0  # Clip gradients to this global norm; 0 = off.


def learning_rate_schedule(options: OptimOptions) -> optax.Schedule:
  """Linear warm-up from 0 to the peak rate, then cosine decay to the end of training."""
  peak = options.peak_learning_rate
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=peak,
      warmup_steps=options.warmup_steps,
      decay_steps=options.num_train_steps,
      end_value=peak * options.end_learning_rate_factor,
  )


def decay_mask(params):
  """Weight decay (and LARS trust ratios) for kernels only: biases and norm params (1-D) are
  spared; a scanned stack's leaves (`zoo.layers.stack_layers`) by one layer's dimensions."""
  return jax.tree_util.tree_map_with_path(
      lambda path, p: model_params.layer_ndim(path, p) > 1, params)


def create_optimizer(options: OptimOptions,
                     schedule: optax.Schedule) -> optax.GradientTransformation:
  """The optimizer of `options` (its weight decay, gradient clipping) with `schedule` as its
  learning rate."""
  mask = None if options.decay_all_params else decay_mask
  if options.optimizer == 'sgd':
    tx = optax.chain(
        optax.add_decayed_weights(options.weight_decay, mask=mask),
        optax.sgd(schedule, momentum=options.momentum or None, nesterov=options.nesterov))
  elif options.optimizer == 'adamw':
    tx = optax.adamw(schedule, b1=options.adam_b1, b2=options.adam_b2,
                     weight_decay=options.weight_decay, mask=mask)
  elif options.optimizer == 'lars':
    tx = optax.lars(schedule, weight_decay=options.weight_decay,
                    weight_decay_mask=mask or True, trust_ratio_mask=mask or True,
                    momentum=options.momentum, nesterov=options.nesterov)
  elif options.optimizer == 'lamb':
    tx = optax.lamb(schedule, b1=options.adam_b1, b2=options.adam_b2,
                    weight_decay=options.weight_decay, mask=mask)
  else:
    raise UserError(f"optimizer={options.optimizer!r} is unknown; choose one of: "
                    f"{', '.join(OPTIMIZERS)} (--config.optimizer=NAME)")
  if options.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(options.grad_clip_norm), tx)
  return tx
