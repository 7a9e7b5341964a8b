"""Orbax saves and restores, the meta item and its format policy (old runs' names
included), params from another run. Imports `base`, `configs` and `zoo`.

`checkpointer` (saves and restores), `meta` (the meta item and its format), `init_from`
(params from another run or a PyTorch state dict)."""
