"""A Flax/linen data-parallel trainer: one train step over a device axis (`jax.pmap`, or
`jax.jit` with `shard_map`) with the gradients averaged by `lax.pmean`, fed the global batches
of a training stream that depends on the config, the seed and the step alone.

`trainer.load(workdir)` gives a trained model back (`trainer/inference.py`)."""


def load(workdir: str, step=None):
  """The model of a run's checkpoint, ready to predict (`trainer.inference.load`)."""
  from trainer import inference  # pylint: disable=import-outside-toplevel  # (jax)
  return inference.load(workdir, step)
