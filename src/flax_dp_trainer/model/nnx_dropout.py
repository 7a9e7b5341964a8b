"""`nnx.Dropout` drawing each example's mask from its key folded with the example's id
(the trace context's `example_ids`), along the input's first axis: what `nnx_layers.build_nnx`
switches a user's NNX Dropout layers to. Imports NNX: loaded for NNX models only."""

from flax import nnx

from flax_dp_trainer.model import intercept
from flax_dp_trainer.trace import context as trace_context


class ExampleDropout(nnx.Dropout):
  """nnx.Dropout, its masks drawn per example (flax_dp_trainer.model.nnx_dropout)."""

  def __call__(self, inputs, *, deterministic=None, rngs=None):
    ids = trace_context.current().example_ids
    deterministic = self.deterministic if deterministic is None else deterministic
    if (ids is None or deterministic or self.rate in (0.0, 1.0) or inputs.ndim == 0 or
        inputs.shape[0] != ids.shape[0]):
      return super().__call__(inputs, deterministic=deterministic, rngs=rngs)
    rngs = self.rngs if rngs is None else rngs
    if isinstance(rngs, nnx.Rngs):
      key = rngs[self.rng_collection]()
    elif isinstance(rngs, nnx.RngStream):
      key = rngs()
    else:
      key = rngs
    return intercept.per_example_dropout(inputs, key, ids, self.rate, self.broadcast_dims)
