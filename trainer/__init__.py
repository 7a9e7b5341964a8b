"""A Flax/linen data-parallel trainer built on jax.pmap."""
