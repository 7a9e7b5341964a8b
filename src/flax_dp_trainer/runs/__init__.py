"""What the tools share to start the package's programs and read their runs back: `processes`
(subprocesses, a free port, the twin's torchrun line), `run_metrics` (a run's scalars and
speed figures), `reporting` (tables), `comparison` (`tools.compare`'s two runs and report).
Internal."""
