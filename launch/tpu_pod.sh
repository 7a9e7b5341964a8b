#!/usr/bin/env bash
# Trains on a Cloud TPU VM pod slice: create the slice, put this checkout on every worker, set
# up the environment on all of them, train (every worker runs one trainer process; JAX joins
# them), stream the logs, delete the slice.
#
#   launch/tpu_pod.sh --name=r50 --zone=us-central2-b --accelerator_type=v4-32 \
#       --config=configs/imagenet_resnet50.py --workdir=gs://BUCKET/r50 \
#       [--project=PROJECT] [--version=tpu-ubuntu2204-base] [--keep] [--dry-run] \
#       [-- --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets ...]
#
# --dry-run prints every command instead of running it. Once the slice is created, the script
# deletes it however it ends (a failed copy or set-up, a failed run, Ctrl-C); --keep leaves it
# up and prints one line naming it and the command that deletes it.
set -euo pipefail

name="" zone="" accelerator_type="" config="" workdir="" project=""
version="tpu-ubuntu2204-base"
dry_run=0 keep=0
usage="usage: $0 --name=NAME --zone=ZONE --accelerator_type=TYPE --config=FILE --workdir=gs://... [--project=P] [--version=V] [--keep] [--dry-run] [-- TRAINER_ARGS...]"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --accelerator_type=*) accelerator_type="${1#*=}" ;;
    --config=*) config="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --version=*) version="${1#*=}" ;;
    --keep) keep=1 ;;
    --dry-run) dry_run=1 ;;
    --) shift; break ;;
    *) echo "error: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
for required in name zone accelerator_type config workdir; do
  if [[ -z "${!required}" ]]; then
    echo "error: --$required is required; $usage" >&2
    exit 2
  fi
done
if [[ "$workdir" != gs://* ]]; then
  echo "error: --workdir=$workdir must be a gs:// path that every worker can write; e.g. --workdir=gs://BUCKET/$name" >&2
  exit 2
fi

# Single-quotes an argument unless it is plain, so printed commands can be pasted into a shell.
quote() {
  local arg out=()
  for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./:=@,+-]+$ ]]; then
      out+=("$arg")
    else
      out+=("'${arg//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# Runs a command, or prints it with --dry-run.
run() {
  if [[ $dry_run -eq 1 ]]; then
    quote "$@"
  else
    "$@"
  fi
}

common=(--zone="$zone")
[[ -n "$project" ]] && common+=(--project="$project")
trainer_args=" $(quote "--config=$config" "--workdir=$workdir" "$@")"
archive=/tmp/$name-trainer.tar.gz

delete=(gcloud compute tpus tpu-vm delete "$name" "${common[@]}" --quiet)
created=0
# Whatever ends the script after the slice exists, the slice goes (or, with --keep, is named).
finish() {
  local status=$?
  trap - EXIT
  if [[ $created -eq 1 && $keep -eq 0 ]]; then
    run "${delete[@]}" || { status=1; echo "error: the slice $name could not be deleted; delete it with: $(quote "${delete[@]}")" >&2; }
  elif [[ $created -eq 1 ]]; then
    echo "the slice $name is still running (--keep); delete it with: $(quote "${delete[@]}")" >&2
  fi
  exit "$status"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

run gcloud compute tpus tpu-vm create "$name" "${common[@]}" \
    --accelerator-type="$accelerator_type" --version="$version"
created=1
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  echo "warning: the slice gets the last commit (git archive HEAD); your uncommitted edits are not in it" >&2
fi
run git archive --format=tar.gz --output="$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$name:~/trainer.tar.gz" "${common[@]}" --worker=all
run gcloud compute tpus tpu-vm ssh "$name" "${common[@]}" --worker=all \
    --command="mkdir -p ~/trainer && tar -xzf ~/trainer.tar.gz -C ~/trainer && cd ~/trainer && python3 -m pip install -q -e '.[tpu]'"
# Every worker trains; the output of all of them streams back here until the run ends (the
# EXIT trap then deletes the slice, or names it with --keep).
run gcloud compute tpus tpu-vm ssh "$name" "${common[@]}" --worker=all \
    --command="cd ~/trainer && python3 -m trainer.main$trainer_args"
