#!/usr/bin/env bash
# Trains on a Cloud TPU VM pod slice: create the slice, put this checkout on every worker, set
# up the environment on all of them, train (every worker runs one trainer process; JAX joins
# them), stream the logs, delete the slice.
#
#   launch/tpu_pod.sh --name=r50 --zone=us-central2-b --accelerator_type=v4-32 \
#       --config=imagenet_resnet50 --workdir=gs://BUCKET/r50 \
#       [--project=PROJECT] [--version=tpu-ubuntu2204-base] [--extra_files=PATH,...] \
#       [--max_restarts=N] [--keep] [--dry-run] \
#       [-- --config.tfds_data_dir=gs://BUCKET/tensorflow_datasets ...]
#
# --max_restarts=N: when the training fails (a worker lost, the slice preempted), the script
# asks for the slice's state; a slice that is not READY is deleted and created again (copy and
# set-up included), and the training starts again on it from the newest checkpoint in the
# gs:// workdir, up to N times. On a READY slice the training is started again as it is. Each
# restart is one line naming the cause. Queued resources are not managed: a slice that cannot
# be created ends the script.
#
# Your own model (--config.model=pkg.module:Name) is imported on every worker, so its module
# must be there: commit it to this repository (the workers get the last commit), or name its
# files or folders, comma-separated, with --extra_files. Each is copied, under its own name,
# into ~/trainer_extra on every worker (one archive, gcloud ... scp --worker=all), and that
# folder is put first on PYTHONPATH for the trainer. (`python -m` looks in its working
# directory, the checkout ~/trainer, before PYTHONPATH: a package of yours named `tests`, like
# the checkout's own folder, is hidden; the trainer itself is the installed flax_dp_trainer.)
# A folder arrives whole, with its name:
#
#   launch/tpu_pod.sh --name=mine --zone=us-central2-b --accelerator_type=v4-8 \
#       --config=default --workdir=gs://BUCKET/mine \
#       --extra_files=~/src/my_models,~/src/extra_layer.py -- --config.model=my_models.net:Net
#
# (my_models is a folder holding net.py, on the workers ~/trainer_extra/my_models/net.py.)
# A path that does not exist is refused before anything is created or copied.
#
# --dry-run prints every command instead of running it. Once the slice is created, the script
# deletes it however it ends (a failed copy or set-up, a failed run, Ctrl-C); --keep leaves it
# up and prints one line naming it and the command that deletes it.
set -euo pipefail

name="" zone="" accelerator_type="" config="" workdir="" project="" extra_files=""
version="tpu-ubuntu2204-base"
dry_run=0 keep=0 extra_given=0 max_restarts=0
usage="usage: $0 --name=NAME --zone=ZONE --accelerator_type=TYPE --config=FILE --workdir=gs://... [--project=P] [--version=V] [--extra_files=PATH,...] [--max_restarts=N] [--keep] [--dry-run] [-- TRAINER_ARGS...]"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name=*) name="${1#*=}" ;;
    --zone=*) zone="${1#*=}" ;;
    --accelerator_type=*) accelerator_type="${1#*=}" ;;
    --config=*) config="${1#*=}" ;;
    --workdir=*) workdir="${1#*=}" ;;
    --project=*) project="${1#*=}" ;;
    --version=*) version="${1#*=}" ;;
    --extra_files=*) extra_files="${1#*=}"; extra_given=1 ;;
    --max_restarts=*) max_restarts="${1#*=}" ;;
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
if ! [[ "$max_restarts" =~ ^[0-9]+$ ]]; then
  echo "error: --max_restarts=$max_restarts must be a whole number, e.g. --max_restarts=3" >&2
  exit 2
fi
if [[ "$workdir" != gs://* ]]; then
  echo "error: --workdir=$workdir must be a gs:// path that every worker can write; e.g. --workdir=gs://BUCKET/$name" >&2
  exit 2
fi
# --extra_files: every path must exist here, and no two may share a name on the workers (each
# lands as ~/trainer_extra/BASENAME). tar_sources gets a -C FOLDER BASENAME pair for each.
tar_sources=() extra_names=() extra_paths=()
if [[ $extra_given -eq 1 ]]; then
  IFS=, read -r -a extra_list <<< "$extra_files"
  for path in "${extra_list[@]+"${extra_list[@]}"}"; do
    [[ -z "$path" ]] && continue  # a trailing or doubled comma
    [[ "$path" == "~/"* ]] && path="$HOME/${path#"~/"}"  # the shell leaves ~ after --flag= alone
    if [[ ! -e "$path" ]]; then
      echo "error: --extra_files: $path does not exist (looked for from $PWD); name files or folders that exist, comma-separated, e.g. --extra_files=my_models,layers.py" >&2
      exit 2
    fi
    if [[ -d "$path" ]]; then
      absolute="$(CDPATH='' cd -- "$path" && pwd)"
    else
      absolute="$(CDPATH='' cd -- "$(dirname -- "$path")" && pwd)/$(basename -- "$path")"
    fi
    base="$(basename -- "$absolute")"
    for ((i = 0; i < ${#extra_names[@]}; i++)); do
      if [[ "${extra_names[$i]}" == "$base" ]]; then
        echo "error: --extra_files: $path and ${extra_paths[$i]} would both be ~/trainer_extra/$base on the workers; rename one, or name their common folder instead" >&2
        exit 2
      fi
    done
    extra_names+=("$base") extra_paths+=("$path")
    tar_sources+=(-C "$(dirname -- "$absolute")" "$base")
  done
  if [[ ${#tar_sources[@]} -eq 0 ]]; then
    echo "error: --extra_files names nothing; name files or folders, comma-separated, e.g. --extra_files=my_models,layers.py (or leave the flag out)" >&2
    exit 2
  fi
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
extra_archive=/tmp/$name-extra.tar.gz
setup="mkdir -p ~/trainer && tar -xzf ~/trainer.tar.gz -C ~/trainer"
train="cd ~/trainer && python3 -m flax_dp_trainer$trainer_args"
if [[ ${#tar_sources[@]} -gt 0 ]]; then
  setup+=" && mkdir -p ~/trainer_extra && tar -xzf ~/trainer_extra.tar.gz -C ~/trainer_extra"
  train="cd ~/trainer && PYTHONPATH=\$HOME/trainer_extra\${PYTHONPATH:+:\$PYTHONPATH} python3 -m flax_dp_trainer$trainer_args"
fi

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

# Creates the slice, puts this checkout (and --extra_files) on every worker and sets it up.
bring_up() {
  run gcloud compute tpus tpu-vm create "$name" "${common[@]}" \
      --accelerator-type="$accelerator_type" --version="$version"
  created=1
  if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    echo "warning: the slice gets the last commit (git archive HEAD); your uncommitted edits are not in it" >&2
  fi
  run git archive --format=tar.gz --output="$archive" HEAD
  run gcloud compute tpus tpu-vm scp "$archive" "$name:~/trainer.tar.gz" "${common[@]}" --worker=all
  if [[ ${#tar_sources[@]} -gt 0 ]]; then  # --extra_files, for ~/trainer_extra on every worker
    run tar -czf "$extra_archive" "${tar_sources[@]}"
    run gcloud compute tpus tpu-vm scp "$extra_archive" "$name:~/trainer_extra.tar.gz" "${common[@]}" --worker=all
  fi
  run gcloud compute tpus tpu-vm ssh "$name" "${common[@]}" --worker=all \
      --command="$setup && cd ~/trainer && python3 -m pip install -q -e '.[tpu]'"
}

bring_up
# Every worker trains; the output of all of them streams back here until the run ends (the
# EXIT trap then deletes the slice, or names it with --keep). A failed run is started again,
# on a slice created again where it is not READY, up to --max_restarts times.
restarts=0
while true; do
  status=0
  run gcloud compute tpus tpu-vm ssh "$name" "${common[@]}" --worker=all \
      --command="$train" || status=$?
  [[ $status -eq 0 ]] && break
  if [[ $restarts -ge $max_restarts ]]; then
    echo "error: the training failed (status $status) after $restarts restart(s) (--max_restarts=$max_restarts)" >&2
    exit "$status"
  fi
  restarts=$((restarts + 1))
  state="$(gcloud compute tpus tpu-vm describe "$name" "${common[@]}" --format='value(state)' 2>/dev/null || true)"
  if [[ "$state" == READY ]]; then
    echo "launch/tpu_pod.sh: restart $restarts of $max_restarts: the training exited with status $status on a READY slice; starting it again from the newest checkpoint in $workdir" >&2
  else
    echo "launch/tpu_pod.sh: restart $restarts of $max_restarts: the training exited with status $status and the slice $name is ${state:-gone}; creating it again, then resuming from the newest checkpoint in $workdir" >&2
    run "${delete[@]}" || true
    created=0
    bring_up
  fi
done
