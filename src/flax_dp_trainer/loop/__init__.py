"""The training loop and what it decides with: config checks before anything starts, when
to log, evaluate and save, stop signals, the workdir lock, metric writers, step timing and
FLOPs. Imports every library layer below it.

`train` (the loop), `setup` (a run's setup and start), `evaluation`, `checks`, `cadence`,
`signals`, `workdir` (the lock), `writers`, `efficiency`."""
