"""NNX modules as the trainer trains them (through `flax.nnx.bridge.ToLinen`): built in
training or evaluation mode, each `nnx.BatchNorm` given the device axis, each `nnx.Dropout`
drawing per example. NNX has no method interceptors, so those Dropout layers are switched to a
subclass that does, those BatchNorm layers to one that computes its training statistics over
groups of the global batch while the trace context holds active groups (`batchnorm_groups`), and
the streams a module keeps for itself are found to be said at start.
`flax.nnx` is imported inside the functions: runs of linen models start without it.
"""

from typing import Any

import jax

from flax_dp_trainer.model import batchnorm_groups
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.trace import context as trace_context


NNX_OWN_RNG = ('the NNX model keeps random streams of its own ({}): their draws are the same '
                'on every device, so the result depends on the device count')


def build_nnx(cls: type, kwargs: dict, train: bool, rngs=None) -> Any:
  """An NNX module of `cls` in training or evaluation mode, its BatchNorm layers reducing
  over the device axis and its Dropout layers drawing per example."""
  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  from flax import nnx
  from flax_dp_trainer.model import nnx_dropout
  module = cls(**kwargs) if rngs is None else cls(**kwargs, rngs=rngs)
  if train:
    module.train()
  else:
    module.eval()
  grouped = None  # The grouped class, made at the first plain BatchNorm of this model.
  for _, layer in module.iter_modules():
    if isinstance(layer, nnx.BatchNorm) and layer.axis_name is None:
      layer.axis_name = AXIS_NAME
      if type(layer) is nnx.BatchNorm:  # pylint: disable=unidiomatic-typecheck
        grouped = grouped or _grouped_batchnorm()
        layer.__class__ = grouped  # As the Dropout layers below.
    if type(layer) is nnx.Dropout:  # pylint: disable=unidiomatic-typecheck
      # The only way in without editing the user's module (no NNX interceptors); without it,
      # test_user_model.py's per-example test of NnxNet fails.
      layer.__class__ = nnx_dropout.ExampleDropout
  return module


def _grouped_batchnorm() -> type:
  """`nnx.BatchNorm` whose training statistics are over the trace context's BatchNorm
  groups where they are active (made once, at the first NNX model: linen runs never import NNX)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (as above)

  class GroupedBatchNorm(nnx.BatchNorm):
    """nnx.BatchNorm, its training statistics over groups of the global batch where
    the trace context holds active groups (flax_dp_trainer.model.batchnorm_groups)."""

    def __call__(self, x, use_running_average=None, *, mask=None):
      now = trace_context.current()
      groups = now.bn_groups
      running = self.use_running_average if use_running_average is None else (
          use_running_average)
      if groups is None or not groups.active or running is None or running:
        return super().__call__(x, use_running_average, mask=mask)
      ids = now.example_ids
      batchnorm_groups.check_rows(x, None if ids is None else ids.shape[0],
                                  'an nnx.BatchNorm', groups)
      return batchnorm_groups.nnx_call(self, groups, x, mask=mask)

  return GroupedBatchNorm


def nnx_own_streams(cls: type, kwargs: dict, takes_rngs: bool) -> list[str]:
  """The paths of the random streams an NNX module keeps outside its Dropout layers."""
  from flax import nnx  # pylint: disable=import-outside-toplevel  # (start-up: NNX users only)
  own = []

  def build():
    module = cls(**kwargs, rngs=nnx.Rngs(0)) if takes_rngs else cls(**kwargs)
    dropouts = {path for path, layer in module.iter_modules() if isinstance(layer, nnx.Dropout)}
    for path, node in nnx.iter_graph(module):
      if isinstance(node, (nnx.Rngs, nnx.RngStream)) and not any(
          tuple(path[:len(d)]) == tuple(d) for d in dropouts):
        own.append('/'.join(map(str, path)))
    return 0

  jax.eval_shape(build)
  # A stream is reached through its Rngs too: name each place once.
  return [p for p in own if not any(p != q and p.startswith(q + '/') for q in own)]
