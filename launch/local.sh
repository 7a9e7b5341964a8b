#!/usr/bin/env bash
# Runs a multi-process training job on this machine: P trainer processes with D simulated CPU
# devices each, joined by JAX's distributed runtime over loopback. For exercising multi-host
# logic, and failures, without a cluster.
#
#   launch/local.sh --num_processes=2 --devices_per_process=2 -- \
#       --config=default --workdir=/tmp/mp
#
# Each process's output is prefixed with [pN]. If any process fails, the others are stopped
# (SIGTERM, then SIGKILL) and the launcher exits with that process's status; it exits 0 only
# when every process did. With --max_restarts=N it starts the run again from its newest
# checkpoint instead, up to N times, on the processes that remain (--min_processes=M at
# least); --hang_timeout_s=S also restarts a run whose processes make no progress for S
# seconds; --debug_fault=kill@STEP:PROC,lose@STEP:PROC,stall@STEP:PROC rehearses failures.
# Each restart is a line here and a record in WORKDIR/restarts.jsonl (docs/multihost.md).
#
# Every process runs on this machine, in the directory you start the launcher from (it does not
# change directory), with your environment as it is (PYTHONPATH included; set PYTHON to choose
# the interpreter). `python -m` looks in that directory first, then on PYTHONPATH, so your own
# model (--config.model=pkg.module:Name) imports if pkg/ or module.py is in the directory you
# run from, or its folder is on PYTHONPATH; the trainer is the installed flax_dp_trainer
# (pip install flax-dp-trainer, or pip install -e . in the checkout):
#
#   cd ~/src && ~/trainer/launch/local.sh -- --config=default \
#       --workdir=/tmp/mine --config.model=my_models.net:Net   # ~/src/my_models/net.py
#
# The launcher itself is `python -m flax_dp_trainer.launch` (its --help lists every flag).
exec "${PYTHON:-python}" -m flax_dp_trainer.launch "$@"
