"""What every layer may use: the error types, command-line helpers (a config flag that
takes a shipped config's name), the batch dict's key names, a user's `config.imports` and
objects by import path, constructor arguments recorded by import path (`arguments`), what
the processes of a run agree on, TensorFlow loaded with triton kept out after it
(`tensorflow_import`, `torch_import`). Imports `configs` only."""
