"""The device axis and the layouts over it (`layouts`: `pmap`; `jit` + `shard_map` with the
state replicated or sharded), layer-by-layer FSDP's gathering (`fsdp`), how far the host
runs ahead of the devices (`dispatch`), and simulated CPU devices (`simulated`). Imports
`base` and `zoo` (the names of a scanned stack's leaves, and the hook by which a marked block
asks to be gathered)."""
