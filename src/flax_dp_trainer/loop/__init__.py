"""The training loop and what it decides with, all from options (the edge reads the config):
the loop (`session`), a run and where it begins (`setup`), the options it takes (`options`),
evaluation, when to log, evaluate and save (`cadence`), stop signals, the workdir lock,
metric writers and the trackers' writers, step timing and FLOPs. Imports every library layer
below it."""
