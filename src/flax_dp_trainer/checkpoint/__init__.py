"""Orbax saves and restores, the meta item and its format policy (old runs' names
included), params from another run. Imports `base`, `configs` and `zoo`.

`checkpointer` (saves and restores), `meta` (the meta item and its format), `saved_arrays`
(a checkpoint's arrays against those a config wants), `init_from` (params from another run
or a PyTorch state dict)."""
