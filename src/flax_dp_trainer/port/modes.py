"""The two models as the port check runs them: the flax port on one device (a BatchNorm over
a device axis runs without one, as the trainer gives it its own), and both with dropout off
in each mode (a flax Dropout left on in eval mode refused in one line)."""

import contextlib

import flax.linen as nn
import jax
import torch


def one_device(next_fun, args, kwargs, context):
  """A BatchNorm that reduces over a device axis runs as a clone of itself without one (the
  check runs on one device; the trainer gives it its own axis)."""
  module = context.module
  if (isinstance(module, nn.BatchNorm) and context.method_name == '__call__' and
      module.axis_name is not None):
    return module.clone(parent=module.scope, axis_name=None)(*args, **kwargs)
  return next_fun(*args, **kwargs)


class DropoutOn(Exception):
  """A flax Dropout that would draw in eval mode."""


def no_dropout(strict: bool):
  """While inside, flax `nn.Dropout` passes its input through; with `strict`, one that would
  draw (not deterministic) is refused in one line naming it."""

  def intercept(next_fun, args, kwargs, context):
    module = context.module
    if isinstance(module, nn.Dropout) and context.method_name == '__call__':
      given = kwargs.get('deterministic', args[1] if len(args) > 1 else None)
      deterministic = nn.merge_param('deterministic', module.deterministic, given)
      if strict and not deterministic:
        raise DropoutOn(f'in eval mode at flax Dropout {"/".join(module.scope.path)}: it is '
                         f'on (deterministic=False with train=False; rate here {module.rate}), '
                         'so evaluation would draw masks; pass it deterministic=not train')
      return args[0] if args else kwargs['inputs']
    return next_fun(*args, **kwargs)

  return nn.intercept_methods(intercept)


def dropout_in_eval(apply_eval, variables, x) -> None:
  """Traces eval mode once: a Dropout left on is refused before anything is compared."""
  jax.eval_shape(lambda v: apply_eval(v, x), variables)


@contextlib.contextmanager
def train_without_dropout(module):
  """The torch module in train mode while inside, its Dropout layers in eval mode (off);
  then in the mode it had."""
  was_training = module.training
  module.train()
  for m in module.modules():
    if isinstance(m, torch.nn.modules.dropout._DropoutNd):  # pylint: disable=protected-access
      m.eval()
  try:
    yield module
  finally:
    module.train(was_training)
