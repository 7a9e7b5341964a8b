"""What every layer may use: the error types, command-line helpers (a config flag that
takes a shipped config's name), the batch dict's key names, a user's `config.imports` and
objects by import path, constructor arguments recorded by import path (`arguments`), what
the processes of a run agree on, triton kept out of a process that holds TensorFlow
(`triton_guard`). Imports `configs` only."""
