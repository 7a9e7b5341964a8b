"""Orbax saves and restores, the meta item and its format policy (old runs' names
included), params from another run. Imports `base`, `configs` and `zoo`."""
