"""Tools users run from the repository root as modules: `python -m scripts.NAME`."""
