"""Pure train and eval steps, written for one device of the data-parallel axis `AXIS_NAME`.

Batches arrive as uint8 images and int32 labels; the steps normalize the images on the device
(the dataset's mean and std) and the train step mixes them there (Mixup/CutMix, `mix`) and
erases them (timm's pixel mode, `batch_erasing`) before the model sees them in its compute dtype.
Nothing here touches files or the host. The train step is its gradient pass (`step_gradients`:
every collective) and its update (`apply_gradients`: none); `make_train_step` /
`make_eval_step` map a step over the devices of a `parallel.DataParallel` layout (`jax.pmap`,
or `jax.jit` + `jax.shard_map`); both layouts run the same step body.
"""

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax import lax

from flax_dp_trainer.step import ema as ema_lib
from flax_dp_trainer.step import batch_erasing as erasing_lib
from flax_dp_trainer.step import losses
from flax_dp_trainer.step import mix as mix_lib
from flax_dp_trainer.step import param_groups
from flax_dp_trainer.parallel import layouts as parallel
from flax_dp_trainer.base.batch_keys import EXAMPLE_ID_KEY, MASK_KEY, MIX_LABEL_KEY, MIX_WEIGHT_KEY
from flax_dp_trainer.data import specs
from flax_dp_trainer.step.metrics import EmaEvalMetrics, EvalMetrics, ScaledTrainMetrics
from flax_dp_trainer.step.metrics import TrainMetrics
from flax_dp_trainer.parallel import fsdp
from flax_dp_trainer.parallel.layouts import AXIS_NAME
from flax_dp_trainer.step.state import TrainState
from flax_dp_trainer.model import batchnorm_groups


@dataclasses.dataclass(frozen=True)
class Normalization:
  """Images to the model's input: x / 255 for uint8 images (float32 ones as they are), less
  the dataset's per-channel mean, over its std; then in the compute dtype."""
  mean: tuple[float, ...] = (0.0,)
  std: tuple[float, ...] = (1.0,)
  dtype: str = 'float32'  # The compute dtype (config.dtype).

  @classmethod
  def of(cls, ds_spec: specs.DatasetSpec, dtype: str) -> 'Normalization':
    """The statistics of `ds_spec` (the dataset's, or the config's: `data.run_datasets`)."""
    return cls(tuple(ds_spec.mean), tuple(ds_spec.std), dtype)

  def to_float(self, images: jax.Array) -> jax.Array:
    """float32 normalized images."""
    if images.dtype == jnp.uint8:
      images = images.astype(jnp.float32) / 255.0
    elif images.dtype == jnp.float32:
      pass  # Float datasets (arrays) are on their own scale.
    else:
      raise TypeError(f'the steps take uint8 or float32 images (as the input pipeline sends '
                      f'them), got {images.dtype}')
    return (images - jnp.asarray(self.mean, jnp.float32)) / jnp.asarray(self.std, jnp.float32)

  def __call__(self, images: jax.Array) -> jax.Array:
    return self.to_float(images).astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What a train step does besides one plain update."""
  label_smoothing: float = 0.0  # Of the training loss's targets.
  grad_accum_steps: int = 1  # Micro-batches per device per step; their gradients averaged.
  # The EMA of the params the state keeps and how it moves (`step.ema`); None: no EMA.
  ema: Optional[ema_lib.EmaOptions] = None
  skip_nonfinite: bool = False  # A step with NaN/Inf loss or gradients changes nothing.
  normalization: Normalization = Normalization()
  mix: mix_lib.MixOptions = mix_lib.MixOptions()  # Mixup/CutMix of the global batch.
  # timm's pixel-mode erasing, after the mixing (`step.batch_erasing`).
  erasing: erasing_lib.ErasingOptions = erasing_lib.ErasingOptions()
  # `loss(logits, targets) -> per-example loss` on dense targets (flax_dp_trainer.step.losses).
  loss: losses.Loss = losses.softmax_xent
  remat: str = 'none'  # The blocks' rematerialization policy (trace.context.REMAT_POLICIES).
  frozen: str = ''  # A regex of params not trained (`param_groups`): no gradient flows.
  # The model trains in evaluation mode (BatchNorm's running statistics used and kept).
  frozen_batch_stats: bool = False
  # BatchNorm's training statistics over consecutive groups of the global batch (each forward
  # pass's rows, in order); inactive: over all of it.
  bn_groups: batchnorm_groups.BatchNormGroups = batchnorm_groups.BatchNormGroups()


def example_losses(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0,
                   mix_labels: Optional[jax.Array] = None,
                   mix_weights: Optional[jax.Array] = None,
                   loss: losses.Loss = losses.softmax_xent) -> jax.Array:
  """Per-example `loss` of float32 `logits` against the dense targets of integer `labels`
  (`losses.targets`: one-hot, mixed with `mix_labels` by `mix_weights`, smoothed)."""
  logits = logits.astype(jnp.float32)
  return loss(logits, losses.targets(labels, logits.shape[-1], label_smoothing, mix_labels,
                                     mix_weights))


def model_inputs(batch: dict, options: StepOptions, step_key: jax.Array) -> dict:
  """This device's rows as the model and loss take them: images normalized (and, where
  configured, mixed with their partners of the global batch, then erased), each example's
  global row."""
  images, labels = batch['image'], batch['label']
  ids = example_ids(labels.shape[0])
  inputs = dict(batch, **{EXAMPLE_ID_KEY: ids})
  entries = {}
  if options.mix.active:
    images, entries = mix_lib.mix(options.mix, mix_lib.batch_key(step_key), images, labels,
                                  options.normalization.to_float)
  else:
    images = options.normalization.to_float(images)
  if options.erasing.active:
    images = erasing_lib.erase(options.erasing, erasing_lib.batch_key(step_key), images, ids)
  return dict(inputs, image=images.astype(options.normalization.dtype), **entries)


def example_ids(per_device: int) -> jax.Array:
  """The global-batch rows of this device's examples: device i holds rows i*b .. (i+1)*b-1."""
  return lax.axis_index(AXIS_NAME) * per_device + jnp.arange(per_device)


class Gradients(NamedTuple):
  """What every gradient function returns; `grads` are already averaged over the devices."""
  loss: jax.Array  # This device's mean loss.
  logits: jax.Array  # (per-device batch, classes)
  batch_stats: Any  # BatchNorm statistics after the step (None without BatchNorm).
  grads: Any


def _loss_fn(state: TrainState, options: StepOptions,
             how: Optional[fsdp.Gathering] = None) -> Callable:
  """(params, batch_stats, batch, rng) -> (mean loss, (logits, new batch_stats)). With `how`
  (layer-by-layer FSDP) `params` are this device's parts: the blocks gather theirs as they
  run, the other layers' are gathered first."""
  has_batch_stats = state.batch_stats is not None
  updates_stats = has_batch_stats and not options.frozen_batch_stats
  # How the model traces (`Model.apply` sets it around its apply), each only where set: an
  # `apply_fn` of the state need not take it otherwise.
  tracing = {'bn_groups': options.bn_groups} if options.bn_groups.active else {}
  if options.remat != 'none':
    tracing['remat'] = options.remat
  if how is not None:
    tracing['gathering'] = how

  def loss_fn(params, batch_stats, batch, rng):
    if options.frozen:  # No gradient reaches them: the backward pass stops there.
      params = jax.tree.map(lambda frozen, p: lax.stop_gradient(p) if frozen else p,
                            param_groups.frozen_mask(options.frozen, params), params)
    if how is not None and not how.recording:
      params = how.gather_outside_blocks(params)
    variables = {'params': params}
    if has_batch_stats:
      variables['batch_stats'] = batch_stats
    out = state.apply_fn(variables, batch['image'], train=not options.frozen_batch_stats,
                         example_ids=batch[EXAMPLE_ID_KEY], rngs={'dropout': rng},
                         mutable=['batch_stats'] if updates_stats else False, **tracing)
    logits, new_batch_stats = (out[0], out[1]['batch_stats']) if updates_stats else (
        out, batch_stats)
    loss = jnp.mean(example_losses(logits, batch['label'], options.label_smoothing,
                                   batch.get(MIX_LABEL_KEY), batch.get(MIX_WEIGHT_KEY),
                                   options.loss))
    return loss, (logits, new_batch_stats)

  return loss_fn


def device_mean(grads: Any) -> Any:
  """Gradients averaged over the devices. Every device holds the mean over an equal share of
  the global batch, so the mean of the device means is the gradient of the global-batch mean
  loss."""
  return lax.pmean(grads, AXIS_NAME)


def plain_gradients(loss_fn: Callable, state: TrainState, batch: dict, rng: jax.Array,
                    reduce: Callable = device_mean) -> Gradients:
  """This device's loss, logits, new BatchNorm statistics and gradients on its whole batch,
  the gradients averaged over the devices by `reduce`."""
  (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params, state.batch_stats, batch, rng)
  return Gradients(loss, logits, batch_stats, reduce(grads))


def accumulated_gradients(loss_fn: Callable, state: TrainState, batch: dict, rng: jax.Array,
                          k: int, reduce: Callable = device_mean) -> Gradients:
  """The device's batch as `k` micro-batches in sequence (BatchNorm statistics carried from
  one to the next); their gradients and losses averaged."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def accumulate(carry, micro_batch):
    grad_sum, loss_sum, batch_stats = carry
    (loss, (logits, new_stats)), grads = grad_fn(state.params, batch_stats, micro_batch, rng)
    carry = (jax.tree.map(jnp.add, grad_sum, grads), loss_sum + loss,
             batch_stats if new_stats is None else new_stats)
    return carry, logits

  micro_batches = jax.tree.map(lambda x: x.reshape((k, x.shape[0] // k) + x.shape[1:]), batch)
  init = (jax.tree.map(jnp.zeros_like, state.params), jnp.zeros((), jnp.float32),
          state.batch_stats)
  (grad_sum, loss_sum, batch_stats), logits = lax.scan(accumulate, init, micro_batches)
  grads = jax.tree.map(lambda g: g / k, grad_sum)
  return Gradients(loss_sum / k, logits.reshape((-1,) + logits.shape[2:]), batch_stats,
                   reduce(grads))


def scaled_gradients(loss_fn: Callable, state: TrainState, batch: dict, rng: jax.Array
                     ) -> tuple[Gradients, Any, jax.Array]:
  """float16: gradients of the loss scaled by `state.dynamic_scale`, unscaled and averaged;
  also the adjusted scale and whether they are finite on every device."""
  dynamic_scale, finite, (loss, (logits, batch_stats)), grads = (
      state.dynamic_scale.value_and_grad(loss_fn, has_aux=True, axis_name=AXIS_NAME)(
          state.params, state.batch_stats, batch, rng))
  return Gradients(loss, logits, batch_stats, grads), dynamic_scale, finite


def keep_if_finite(finite: jax.Array, new: TrainState, old: TrainState) -> TrainState:
  """`new`, with params, optimizer state and BatchNorm statistics of `old` where not
  `finite` (the step counter still advances)."""
  keep = lambda a, b: jax.tree.map(lambda x, y: jnp.where(finite, x, y), a, b)
  return new.replace(params=keep(new.params, old.params),
                     opt_state=keep(new.opt_state, old.opt_state),
                     batch_stats=keep(new.batch_stats, old.batch_stats))


def moved_ema(options: ema_lib.EmaOptions, state: TrainState, new_state: TrainState
              ) -> TrainState:
  """`new_state` with the EMA of `state` moved after the step from `state` to it
  (`step.ema`): its params, and its BatchNorm statistics where the state averages them."""
  averaged = ((state.ema_params,) if state.ema_batch_stats is None else
              (state.ema_params, state.ema_batch_stats))
  values = (new_state.params, new_state.batch_stats)[:len(averaged)]
  averaged, count = ema_lib.update(options, state.step, averaged, state.ema_count, values)
  return new_state.replace(ema_params=averaged[0], ema_count=count,
                           ema_batch_stats=averaged[1] if len(averaged) > 1 else None)


class StepGradients(NamedTuple):
  """What a step's gradient pass leaves for its update: everything averaged over the
  devices already, so that the update needs no collective."""
  grads: Any
  batch_stats: Any  # BatchNorm statistics after the step (None without BatchNorm).
  loss: jax.Array  # The global batch's mean loss.
  accuracy: jax.Array
  dynamic_scale: Any  # The adjusted float16 loss scale (None without loss scaling).
  finite: Optional[jax.Array]  # Under loss scaling: whether the gradients are finite.


def _gathering(state: TrainState, options: StepOptions, split_axes: Any, batch: dict,
               rng: jax.Array) -> tuple[fsdp.Gathering, Callable]:
  """Layer-by-layer FSDP: the blocks' gathering over `split_axes` (the dimension each param
  leaf is split along; None where whole), and the reduction of the gradients it makes: a
  split leaf's gradient comes out of the gather's transpose already summed over the devices
  (reduce-scattered), so it is divided by their count; a whole leaf's is averaged."""
  how = fsdp.Gathering(split_axes, AXIS_NAME)
  devices = lax.axis_size(AXIS_NAME)
  whole = jax.tree.map(
      lambda axis, x: jax.ShapeDtypeStruct(
          x.shape if axis is None else
          x.shape[:axis] + (x.shape[axis] * devices,) + x.shape[axis + 1:], x.dtype),
      split_axes, state.params, is_leaf=lambda a: a is None)
  with how.recording_blocks():  # Which params the blocks hold (an abstract pass).
    jax.eval_shape(_loss_fn(state, options, how), whole, state.batch_stats, batch, rng)

  def reduce(grads):
    return jax.tree.map(lambda axis, g: lax.pmean(g, AXIS_NAME) if axis is None else g / devices,
                        split_axes, grads, is_leaf=lambda a: a is None)

  return how, reduce


def step_gradients(state: TrainState, batch: dict, rng: jax.Array, *,
                   options: StepOptions = StepOptions(), split_axes: Any = None
                   ) -> StepGradients:
  """The gradient pass of a train step (`make_train_step`) on this device's rows (its
  collectives: the mixing partners, the gradient and metric means). Reads `step`, `params`,
  `batch_stats` and `dynamic_scale` of `state` only. With `split_axes` (layer-by-layer FSDP,
  a tree like the params of the dimension each leaf is split along over the devices, None
  where whole), `state.params` are this device's parts and so are the gradients returned."""
  if state.dynamic_scale is not None and options.grad_accum_steps > 1:
    raise ValueError(f'grad_accum_steps={options.grad_accum_steps} cannot be honoured under '
                     'float16 loss scaling (state.dynamic_scale): the scaled gradient is of '
                     'one batch; use grad_accum_steps=1 or bfloat16')
  rng = jax.random.fold_in(rng, state.step)
  batch = model_inputs(batch, options, rng)
  how, reduce = None, device_mean
  if split_axes is not None:
    if state.dynamic_scale is not None:
      raise ValueError('layer-by-layer FSDP does not take float16 loss scaling; use bfloat16')
    how, reduce = _gathering(state, options, split_axes, batch, rng)
  loss_fn = _loss_fn(state, options, how)
  dynamic_scale, finite = state.dynamic_scale, None
  if dynamic_scale is not None:
    result, dynamic_scale, finite = scaled_gradients(loss_fn, state, batch, rng)
  elif options.grad_accum_steps > 1:
    result = accumulated_gradients(loss_fn, state, batch, rng, options.grad_accum_steps,
                                   reduce)
  else:
    result = plain_gradients(loss_fn, state, batch, rng, reduce)
  accuracy = jnp.mean(jnp.argmax(result.logits, axis=-1) == batch['label'])
  loss, accuracy = lax.pmean((result.loss, accuracy), AXIS_NAME)
  return StepGradients(result.grads, result.batch_stats, loss, accuracy, dynamic_scale, finite)


def inputs_and_gradients(state: TrainState, batch: dict, rng: jax.Array, *,
                         options: StepOptions = StepOptions()) -> tuple[dict, Gradients]:
  """What `step_gradients` computes on its plain path (no loss scaling, no accumulation, no
  FSDP), with what it leaves out: the model's inputs (normalized and mixed) and its logits;
  the gradients averaged over the devices. The recipe check's view of one step."""
  rng = jax.random.fold_in(rng, state.step)
  inputs = model_inputs(batch, options, rng)
  return inputs, plain_gradients(_loss_fn(state, options), state, inputs, rng)


def apply_gradients(state: TrainState, result: StepGradients, *,
                    learning_rate_fn: optax.Schedule, options: StepOptions = StepOptions()
                    ) -> tuple[TrainState, TrainMetrics]:
  """The update of a train step (`make_train_step`) from its gradient pass: the optimizer
  step, the skip of a non-finite step, the EMA and the metrics. No collective: under
  `jax.pmap` it runs on each device; with the state sharded over the devices
  (`parallel.ShardMapped`), over the global arrays, XLA placing each leaf's part on its
  device."""
  new_state = state.apply_gradients(grads=result.grads, batch_stats=result.batch_stats)
  grad_norm = optax.global_norm(result.grads)
  finite = result.finite
  if finite is None and options.skip_nonfinite:
    finite = jnp.isfinite(result.loss) & jnp.isfinite(grad_norm)
  if finite is not None:
    new_state = keep_if_finite(finite, new_state, state).replace(
        dynamic_scale=result.dynamic_scale)
  if options.ema is not None:
    new_state = moved_ema(options.ema, state, new_state)

  outputs = dict(loss=result.loss, accuracy=result.accuracy, grad_norm=grad_norm,
                 param_norm=optax.global_norm(new_state.params),
                 learning_rate=learning_rate_fn(state.step))
  if result.dynamic_scale is not None:
    return new_state, ScaledTrainMetrics.single_from_model_output(
        loss_scale=result.dynamic_scale.scale, **outputs)
  return new_state, TrainMetrics.single_from_model_output(**outputs)


def eval_step(state: TrainState, batch: dict, *,
              normalization: Normalization = Normalization(),
              loss: losses.Loss = losses.softmax_xent,
              at_size: Optional[Callable[[dict], dict]] = None) -> EvalMetrics | EmaEvalMetrics:
  """Sums over the real examples of this batch on every device (padding has mask 0); the
  loss is the run's `loss` against one-hot targets. Those of the params; where the state
  keeps an EMA, those of the EMA beside them (`EmaEvalMetrics`, one pass over the batch).
  `at_size`: the variables for the evaluation's input size where it is not the training's
  and a param depends on it (`model.input_size.for_size`)."""
  images = normalization(batch['image'])

  def sums(variables):
    variables = at_size(variables) if at_size is not None else variables
    logits = state.apply_fn(variables, images, train=False)
    return EvalMetrics.single_from_model_output(
        logits=logits.astype(jnp.float32), labels=batch['label'],
        loss=example_losses(logits, batch['label'], loss=loss), mask=batch[MASK_KEY])

  mine = sums(state.variables())
  if state.ema_params is not None:
    mine = EmaEvalMetrics.of(mine, sums(state.ema_variables()))
  # Every field is a (total, count) sum: the devices' sums add up.
  return jax.tree.map(lambda x: lax.psum(x, AXIS_NAME), mine)


def make_train_step(layout: parallel.DataParallel, *, learning_rate_fn: optax.Schedule,
                    options: StepOptions = StepOptions()) -> Callable:
  """`(state, batch, rng) -> (state, metrics)` over the layout's devices: one optimizer step
  on the global batch, `step_gradients` on each device's rows (the gradients averaged over
  all devices), then `apply_gradients` (with the state sharded, over the sharded state). The
  state's buffers are donated.

  `rng` is the same on every device; folded with the step number it is the step's RNG, and
  each example's draws fold in its global row (see trace.per_example), so the randomness does
  not depend on how the batch is split over devices. Under float16 loss scaling, and with
  `options.skip_nonfinite`, a step whose loss or gradients are NaN/Inf leaves params,
  optimizer state and BatchNorm statistics unchanged.
  """
  return layout.map_train_step(
      functools.partial(step_gradients, options=options),
      functools.partial(apply_gradients, learning_rate_fn=learning_rate_fn, options=options),
      StepGradients)


def make_eval_step(layout: parallel.DataParallel,
                   normalization: Normalization = Normalization(),
                   loss: losses.Loss = losses.softmax_xent,
                   at_size: Optional[Callable[[dict], dict]] = None) -> Callable:
  """`(state, batch) -> EvalMetrics` over the layout's devices; the optimizer state stays
  where it is (the step is given the state without it). `at_size` as `eval_step` takes it."""
  mapped = layout.map(functools.partial(eval_step, normalization=normalization, loss=loss,
                                        at_size=at_size), num_args=2)
  return lambda state, batch: mapped(state.replace(opt_state=None), batch)
