"""The device axis and the layouts over it (`pmap`; `jit` + `shard_map` with the state
replicated or sharded), and how far the host runs ahead of the devices. Imports `base`
and `zoo`."""
