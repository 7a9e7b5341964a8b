"""CLU metric collections and the per-step metrics buffer; no TensorFlow (the writers and
readers are in `flax_dp_trainer.loop.writers`, throughput and memory in
`flax_dp_trainer.loop.efficiency`)."""

from typing import Callable, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics
from jax import lax


@flax.struct.dataclass
class TrainMetrics(metrics.Collection):
  """Averaged over the steps between two writes; each step's values are already pmean-ed."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Average.from_output('accuracy')
  grad_norm: metrics.Average.from_output('grad_norm')
  param_norm: metrics.LastValue.from_output('param_norm')
  learning_rate: metrics.LastValue.from_output('learning_rate')


# TrainMetrics plus, under float16 loss scaling, the scale after each step's update.
ScaledTrainMetrics = metrics.Collection.create(
    **TrainMetrics.__annotations__, loss_scale=metrics.LastValue.from_output('loss_scale'))


TOP_K = 5  # eval_top5_accuracy: the label among the K highest logits.


@flax.struct.dataclass
class TopKAccuracy(metrics.Average):
  """Share of examples whose label is among the `TOP_K` highest logits (all of them when the
  model has fewer classes: then it is 1)."""

  @classmethod
  def from_model_output(cls, *, logits: jnp.ndarray, labels: jnp.ndarray, **kwargs
                        ) -> 'TopKAccuracy':
    _, top = lax.top_k(logits, min(TOP_K, logits.shape[-1]))
    hit = jnp.any(top == labels[..., None], axis=-1).astype(jnp.float32)
    return cls(**vars(super().from_model_output(values=hit, **kwargs)))


@flax.struct.dataclass
class EvalMetrics(metrics.Collection):
  """Sums over every real (mask = 1) example of the split."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Accuracy
  top5_accuracy: TopKAccuracy


@flax.struct.dataclass
class EmaEvalMetrics(metrics.Collection):
  """`EvalMetrics` of the params, and those of their EMA as `ema_*`, of one pass."""
  loss: metrics.Average.from_output('loss')
  accuracy: metrics.Accuracy
  top5_accuracy: TopKAccuracy
  ema_loss: metrics.Average.from_output('ema_loss')
  ema_accuracy: metrics.Accuracy
  ema_top5_accuracy: TopKAccuracy

  @classmethod
  def of(cls, params: EvalMetrics, ema: EvalMetrics) -> 'EmaEvalMetrics':
    """The two collections of one batch as one."""
    # pylint: disable-next=protected-access
    return cls(_reduction_counter=params._reduction_counter, loss=params.loss,
               accuracy=params.accuracy, top5_accuracy=params.top5_accuracy,
               ema_loss=ema.loss, ema_accuracy=ema.accuracy,
               ema_top5_accuracy=ema.top5_accuracy)


def merge(collections: Sequence[metrics.Collection]) -> metrics.Collection:
  """One collection of several (host copies) of the same type, as if accumulated in one."""
  merged = collections[0]
  for collection in collections[1:]:
    merged = merged.merge(collection)
  return merged


def is_finite(step_metrics: TrainMetrics) -> bool:
  """Whether one step's loss and gradient norm are finite."""
  return bool(np.isfinite(step_metrics.loss.total) and np.isfinite(step_metrics.grad_norm.total))


class TrainMetricsBuffer:
  """Per-step metrics: on the devices until fetched, checked finite, then merged for a write.

  `fetch` brings a list of device collections to the host (one replica's, in one transfer).
  The metrics of a window not written yet go into each checkpoint (`pending`) and come back
  with it (`resume`), so a stopped and resumed run writes the values an uninterrupted run
  writes.
  """

  def __init__(self, fetch: Callable[[list], list], skip_nonfinite: bool,
               collection: type = TrainMetrics):
    self._fetch = fetch
    self._skip = skip_nonfinite
    self._collection = collection  # The step's metrics' type, to read `pending` back into.
    self._on_device = []
    self._on_host = []
    self._skipped = 0
    self.first_nonfinite_step: Optional[int] = None

  def pending(self) -> Optional[dict]:
    """The fetched metrics not written yet (merged) and the steps skipped among them, as
    JSON data; None where there are none."""
    if not self._on_host and not self._skipped:
      return None
    merged = (flax.serialization.to_state_dict(merge(self._on_host)) if self._on_host
              else None)
    return {'metrics': jax.tree.map(lambda x: np.asarray(x).tolist(), merged),
            'skipped': self._skipped}

  def resume(self, pending: Optional[dict]) -> None:
    """Takes back what `pending` returned (of a run stopped mid-window) as the start of the
    current window."""
    if not pending:
      return
    if pending['metrics'] is not None:
      empty = flax.serialization.to_state_dict(self._collection.empty())
      values = jax.tree.map(lambda template, value: np.asarray(value, np.asarray(template).dtype),
                            empty, pending['metrics'])
      self._on_host = [flax.serialization.from_state_dict(self._collection.empty(), values)]
    self._skipped = int(pending['skipped'])

  def diverged_at(self, step: int) -> None:
    """Records that training broke at `step` (where the metrics could not see it: params
    found non-finite at a save); `fetch` returns False from now on."""
    if self.first_nonfinite_step is None:
      self.first_nonfinite_step = step

  def add(self, step: int, step_metrics) -> None:
    """Keeps `step`'s metrics (still on the devices) until the next `fetch`."""
    self._on_device.append((step, step_metrics))

  def fetch(self) -> bool:
    """Moves metrics to the host; False if a step was non-finite and skipping is off."""
    if not self._on_device:
      return self.first_nonfinite_step is None
    fetched = self._fetch([m for _, m in self._on_device])
    for (step, _), host in zip(self._on_device, fetched):
      if self.first_nonfinite_step is not None:
        break  # Steps after a divergence are not training.
      if is_finite(host):
        self._on_host.append(host)
      elif self._skip:
        self._skipped += 1
      else:
        self.first_nonfinite_step = step
    self._on_device = []
    return self.first_nonfinite_step is None

  def scalars(self) -> dict[str, float]:
    """The train scalars of the steps fetched since the last call (and skipped steps)."""
    scalars = train_scalars(merge(self._on_host)) if self._on_host else {}
    if self._skip:
      scalars['train_skipped_steps'] = float(self._skipped)
    self._on_host, self._skipped = [], 0
    return scalars


def train_scalars(collection: TrainMetrics) -> dict[str, float]:
  """The collection's values as `train_loss`, `train_accuracy`, ... and `learning_rate`."""
  values = collection.compute()
  scalars = {f'train_{k}': float(v) for k, v in values.items() if k != 'learning_rate'}
  scalars['learning_rate'] = float(values['learning_rate'])  # Tag without prefix.
  return scalars


def eval_scalars(collection: EvalMetrics | EmaEvalMetrics, prefix: str = 'eval'
                 ) -> dict[str, float]:
  """The collection's values as `{prefix}_loss`, `{prefix}_accuracy`, ... (and the EMA's
  as `{prefix}_ema_loss`, ...)."""
  return {f'{prefix}_{k}': float(v) for k, v in collection.compute().items()}
