#!/usr/bin/env bash
# Runs a multi-process training job on this machine: P trainer processes with D simulated CPU
# devices each, joined by JAX's distributed runtime over loopback. For exercising multi-host
# logic without a cluster.
#
#   launch/local.sh --num_processes=2 --devices_per_process=2 -- \
#       --config=default --workdir=/tmp/mp
#
# Each process's output is prefixed with [pN]. If any process fails, the others are stopped and
# the launcher exits with that process's status; it exits 0 only when every process did.
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
set -u -o pipefail

num_processes=2
devices_per_process=2
port=""
python="${PYTHON:-python}"
usage="usage: $0 [--num_processes=P] [--devices_per_process=D] [--port=N] -- TRAINER_ARGS..."
while [[ $# -gt 0 ]]; do
  case "$1" in
    --num_processes=*) num_processes="${1#*=}" ;;
    --devices_per_process=*) devices_per_process="${1#*=}" ;;
    --port=*) port="${1#*=}" ;;
    --) shift; break ;;
    *) echo "error: unknown launcher argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
for value in "$num_processes" "$devices_per_process"; do
  if ! [[ "$value" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: process and device counts must be positive integers, got '$value'; $usage" >&2
    exit 2
  fi
done
if [[ -z "$port" ]]; then  # A free port, chosen by the kernel.
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

for ((i = 0; i < num_processes; i++)); do
  "$python" -m flax_dp_trainer --cpu_devices="$devices_per_process" \
      --coordinator_address="127.0.0.1:$port" --num_processes="$num_processes" \
      --process_id="$i" "$@" > >(sed -u "s/^/[p$i] /") 2>&1 &
  pids+=("$!")
done

status=0
remaining=("${pids[@]}")
while [[ ${#remaining[@]} -gt 0 ]]; do
  still=()
  for pid in "${remaining[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
      continue
    fi
    wait "$pid"
    code=$?
    if [[ $code -ne 0 && $status -eq 0 ]]; then
      status=$code
      echo "launch/local.sh: process $pid exited with status $code; stopping the others" >&2
      cleanup
    fi
  done
  remaining=("${still[@]+"${still[@]}"}")
  [[ ${#remaining[@]} -gt 0 ]] && sleep 0.5
done
exit "$status"
