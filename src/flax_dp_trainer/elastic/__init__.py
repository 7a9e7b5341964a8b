"""Failures that cost minutes, not the run: the trainer's progress files (`liveness`), failures
on demand (`faults`), where a run's wall time went (`goodput_records`), and the launcher that
restarts a run from its newest checkpoint on the processes that remain (`supervisor`)."""
