"""A Flax/linen data-parallel trainer: one train step over a device axis (`jax.pmap`, or
`jax.jit` with `shard_map`) with the gradients averaged by `lax.pmean`, fed the global batches
of a training stream that depends on the config, the seed and the step alone."""
