"""The probe: one init, one evaluation apply and one training apply of a built model traced
on abstract shapes (`jax.eval_shape`, nothing compiled) before anything starts. It refuses a
model that fails or returns the wrong shape, in one line, and says what the trainer cannot make
topology-invariant (a Dropout input whose first axis is not the batch, a module's own
`self.make_rng` draws): the run goes on, and its result then depends on the device count.
"""

import contextlib
from typing import Any

import jax
import jax.numpy as jnp

from flax_dp_trainer import zoo
from flax_dp_trainer.base.errors import UserError, first_line
from flax_dp_trainer.model import adapter
from flax_dp_trainer.model import intercept
from flax_dp_trainer.model import outputs
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.trace import context as trace_context
from flax_dp_trainer.trace import scope_hooks


def probe(model: adapter.Model, input_shape: tuple[int, ...], batch: int, num_classes: int,
          dtype: str, remat: str = 'none') -> list[str]:
  """Traces init, an evaluation apply and a training apply of `model` on abstract shapes
  (nothing compiled): `UserError` where one fails, the logits are not (batch, num_classes),
  or `remat` (a policy) finds no block to apply to; returns the lines on what the trainer
  cannot make topology-invariant. `input_shape` is one example's; `batch` the rows one device
  applies at a time."""
  x = jax.ShapeDtypeStruct((batch,) + tuple(input_shape), jnp.dtype(dtype))
  key = jax.random.PRNGKey(0)
  where = f'an input of shape {x.shape} ({dtype})'
  try:
    variables = jax.eval_shape(lambda r: model.init(r, (1,) + tuple(input_shape)), key)
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'model={model.name!r} fails to initialize on {where} '
                    f'({first_line(e)})') from None
  whole = jax.eval_shape(lambda v, im: model.apply(v, im, train=False, whole=True),
                         variables, x)
  _check_logits(model, _logits(model, whole, 'evaluation', where), 'evaluation', batch,
                num_classes, where)
  said = outputs.note(model.name, whole, model.logits_key)
  notes = intercept.Notes()
  mutable = ['batch_stats'] if 'batch_stats' in variables else False
  marked = trace_context.MarkedCalls()

  def train_apply(v, im, rng):
    out = model.apply(v, im, train=True, example_ids=jnp.arange(batch), rngs={'dropout': rng},
                      mutable=mutable, notes=notes, whole=True, remat=remat, marked=marked)
    return out[0] if mutable else out

  # One device of a device axis, as the step runs it (BatchNorm reduces over the axis).
  mapped = jax.vmap(train_apply, in_axes=(None, 0, None), axis_name=AXIS_NAME)
  x1 = jax.ShapeDtypeStruct((1,) + x.shape, x.dtype)
  try:
    # A module that takes example_ids keys its own draws by them (as zoo.dropout does).
    watch = model.eval_module is None and not model.takes_example_ids
    with scope_hooks.own_key_requests(notes.own_key) if watch else contextlib.nullcontext():
      whole = jax.eval_shape(mapped, variables, x1, key)
  except UserError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # The user's code.
    raise UserError(f'model={model.name!r} fails in training mode on {where} '
                    f'({first_line(e)})') from None
  logits = _logits(model, whole, 'training', where)
  _check_logits(model, jax.ShapeDtypeStruct(logits.shape[1:], logits.dtype), 'training', batch,
                num_classes, where)
  if remat != 'none' and not marked.count and model.name in zoo.names():
    raise UserError(f'remat={remat!r}: model={model.name!r} has no residual blocks to '
                    'rematerialize (resnet* and vit* have); drop --config.remat')
  if remat != 'none' and not marked.count:
    raise UserError(f'remat={remat!r}: model={model.name!r} marks no block to rematerialize; '
                    'decorate its block classes with @flax_dp_trainer.remat_block '
                    '(docs/your_model.md), or drop --config.remat')
  return ([said] if said else []) + notes.describe()


def _logits(model: adapter.Model, whole: Any, mode: str, where: str) -> Any:
  """The logits of what the module returned (`outputs.logits`), or the one line why not."""
  try:
    return outputs.logits(whole, model.logits_key)
  except ValueError as e:
    raise UserError(f'model={model.name!r} in {mode} on {where} {e}') from None


def _check_logits(model: adapter.Model, out: Any, mode: str, batch: int, num_classes: int,
                  where: str) -> None:
  shape = getattr(out, 'shape', None)
  if shape is None or len(shape) != 2:
    raise UserError(f'model={model.name!r} gives {outputs.kind(out)} as its logits in {mode} on '
                    f'{where}; the trainer needs logits of shape (batch, num_classes) = '
                    f'({batch}, {num_classes}): return them, alone or first in a tuple')
  if shape != (batch, num_classes):
    raise UserError(f'model={model.name!r} gives logits of shape {tuple(shape)} in {mode} on '
                    f'{where}; the trainer needs logits of shape (batch, num_classes) = '
                    f'({batch}, {num_classes}) (declare num_classes in the constructor, or set '
                    'it in model_kwargs)')
