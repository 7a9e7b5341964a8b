"""Launch scripts: the TPU pod commands, argument errors, and how a user's model module reaches
the processes."""

import os
import subprocess
import sys

import pytest

from tests import REPO


def _run(*args):
  return subprocess.run(list(args), cwd=REPO, capture_output=True, text=True, timeout=60,
                        check=False)


def test_tpu_pod_dry_run_prints_the_gcloud_commands():
  result = _run('launch/tpu_pod.sh', '--name=r50', '--zone=us-central2-b',
                '--accelerator_type=v4-32', '--config=imagenet_resnet50',
                '--workdir=gs://bucket/r50', '--project=proj', '--dry-run', '--',
                '--config.tfds_data_dir=gs://bucket/tfds')
  assert result.returncode == 0, result.stderr
  where = '--zone=us-central2-b --project=proj'
  assert result.stdout.splitlines() == [
      f'gcloud compute tpus tpu-vm create r50 {where} --accelerator-type=v4-32 '
      '--version=tpu-ubuntu2204-base',
      'git archive --format=tar.gz --output=/tmp/r50-trainer.tar.gz HEAD',
      f"gcloud compute tpus tpu-vm scp /tmp/r50-trainer.tar.gz 'r50:~/trainer.tar.gz' {where} "
      '--worker=all',
      f"gcloud compute tpus tpu-vm ssh r50 {where} --worker=all '--command=mkdir -p ~/trainer "
      '&& tar -xzf ~/trainer.tar.gz -C ~/trainer && cd ~/trainer && python3 -m pip install -q '
      "-e '\\''.[tpu]'\\'''",
      f"gcloud compute tpus tpu-vm ssh r50 {where} --worker=all '--command=cd ~/trainer && "
      'python3 -m flax_dp_trainer --config=imagenet_resnet50 '
      "--workdir=gs://bucket/r50 --config.tfds_data_dir=gs://bucket/tfds'",
      f'gcloud compute tpus tpu-vm delete r50 {where} --quiet',
  ]


def test_tpu_pod_keep_leaves_the_slice_and_bad_arguments_are_refused():
  kept = _run('launch/tpu_pod.sh', '--name=a', '--zone=z', '--accelerator_type=v4-8',
              '--config=default', '--workdir=gs://b/a', '--keep', '--dry-run')
  assert kept.returncode == 0
  assert not any('delete' in line for line in kept.stdout.splitlines())
  local = _run('launch/tpu_pod.sh', '--name=a', '--zone=z', '--accelerator_type=v4-8',
               '--config=default', '--workdir=/tmp/a', '--dry-run')
  assert local.returncode == 2
  assert local.stderr.startswith('error: --workdir=/tmp/a must be a gs:// path')
  missing = _run('launch/tpu_pod.sh', '--zone=z', '--dry-run')
  assert missing.returncode == 2 and missing.stderr.startswith('error: --name is required')


def test_local_launcher_refuses_bad_counts(tmp_path):
  result = _run('launch/local.sh', '--num_processes=0', '--', '--config=default')
  assert result.returncode == 2
  assert "must be positive integers, got '0'" in result.stderr
  # The console script, from a folder of the user's: a floor above the count, and one to give.
  result = subprocess.run(['dp-launch', '--num_processes=4', '--min_processes=5', '--',
                           '--config=default', f'--workdir={tmp_path / "run"}'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 2
  assert result.stderr == ('error: --min_processes=5 exceeds --num_processes=4; give '
                           '--min_processes=4 or less\n')
  assert os.listdir(tmp_path) == []


FAKE_GCLOUD = '''#!/bin/bash
echo "$*" >> "$GCLOUD_LOG"
[[ " $* " == *" $GCLOUD_FAILS "* ]] && exit 1
exit 0
'''


@pytest.mark.parametrize('fails,keep', [('scp', False), ('ssh', False), ('scp', True)])
def test_tpu_pod_deletes_the_slice_it_created_whatever_fails(tmp_path, fails, keep):
  """With a gcloud whose scp (or ssh) fails after the slice is created, the script deletes
  the slice; with --keep it leaves it and names it with the command that deletes it."""
  gcloud = tmp_path / 'bin' / 'gcloud'
  gcloud.parent.mkdir()
  gcloud.write_text(FAKE_GCLOUD)
  gcloud.chmod(0o755)
  log = tmp_path / 'gcloud.log'
  env = dict(os.environ, PATH=f'{gcloud.parent}:{os.environ["PATH"]}', GCLOUD_LOG=str(log),
             GCLOUD_FAILS=fails)
  result = subprocess.run(
      ['launch/tpu_pod.sh', '--name=t1', '--zone=z', '--accelerator_type=v4-8',
       '--config=default', '--workdir=gs://b/t1', *(['--keep'] if keep else [])],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 1, result.stderr
  calls = [line.split()[3] for line in log.read_text().splitlines()]
  assert calls[0] == 'create' and fails in calls
  if keep:
    assert 'delete' not in calls
    assert result.stderr.strip().splitlines()[-1] == (
        'the slice t1 is still running (--keep); delete it with: gcloud compute tpus tpu-vm '
        'delete t1 --zone=z --quiet')
  else:
    assert calls[-1] == 'delete'


# A gcloud that plays one worker of the slice: scp copies into WORKER_HOME, ssh runs the command
# there (HOME=WORKER_HOME) with a python3 that skips pip and, for the trainer, imports the
# user's model the way `python -m` would (working directory first, then PYTHONPATH).
WORKER_GCLOUD = '''#!/bin/bash
echo "$*" >> "$GCLOUD_LOG"
case "$4" in
  scp) dest="${6#*:}"; cp "$5" "$WORKER_HOME/${dest#\\~/}" ;;
  ssh) for arg in "$@"; do [[ "$arg" == --command=* ]] && command="${arg#--command=}"; done
       HOME="$WORKER_HOME" PATH="$WORKER_BIN:$PATH" bash -c "$command" ;;
esac
'''
WORKER_PYTHON3 = '''#!/bin/bash
[[ "$1 $2" == "-m pip" ]] && exit 0
[[ "$1 $2" == "-m flax_dp_trainer" ]] || exit 3
shift 2
exec "$REAL_PYTHON" -c 'import os, sys
from my_models.net import Net
import extra_layer
print("worker:", os.getcwd(), Net.__module__, sys.modules["my_models.net"].__file__,
      extra_layer.__file__, *sys.argv[1:])' "$@"
'''


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(0o755)


def test_tpu_pod_extra_files_reach_the_workers_and_their_python_path(tmp_path):
  """--extra_files=FOLDER,FILE: both reach the worker's ~/trainer_extra (one archive, scp
  --worker=all), and the trainer, started in ~/trainer, imports the model from there."""
  user = tmp_path / 'user src'  # outside the repository; a space, to check the quoting
  (user / 'my_models').mkdir(parents=True)
  (user / 'my_models' / '__init__.py').write_text('')
  (user / 'my_models' / 'net.py').write_text('class Net:\n  pass\n')
  (user / 'extra_layer.py').write_text('')
  worker = tmp_path / 'worker'
  worker.mkdir()
  _executable(tmp_path / 'bin' / 'gcloud', WORKER_GCLOUD)
  _executable(tmp_path / 'worker_bin' / 'python3', WORKER_PYTHON3)
  log = tmp_path / 'gcloud.log'
  name = f'xf{os.getpid()}'
  env = dict(os.environ, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}', GCLOUD_LOG=str(log),
             WORKER_HOME=str(worker), WORKER_BIN=str(tmp_path / 'worker_bin'),
             REAL_PYTHON=sys.executable, PYTHONPATH='/elsewhere')
  try:
    result = subprocess.run(
        ['launch/tpu_pod.sh', f'--name={name}', '--zone=z', '--accelerator_type=v4-8',
         '--config=default', '--workdir=gs://b/x',
         f'--extra_files={user / "my_models"}/,{user / "extra_layer.py"},', '--',
         '--config.model=my_models.net:Net'],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
  finally:
    for archive in (f'/tmp/{name}-trainer.tar.gz', f'/tmp/{name}-extra.tar.gz'):
      if os.path.exists(archive):
        os.remove(archive)
  assert result.returncode == 0, result.stderr
  calls = log.read_text().splitlines()
  assert [call.split()[3] for call in calls] == ['create', 'scp', 'scp', 'ssh', 'ssh', 'delete']
  assert calls[2] == (f'compute tpus tpu-vm scp /tmp/{name}-extra.tar.gz '
                      f'{name}:~/trainer_extra.tar.gz --zone=z --worker=all')
  assert 'PYTHONPATH=$HOME/trainer_extra${PYTHONPATH:+:$PYTHONPATH} python3 -m flax_dp_trainer' in (
      calls[4])
  extra = worker / 'trainer_extra'
  assert sorted(str(p.relative_to(extra)) for p in extra.rglob('*')) == [
      'extra_layer.py', 'my_models', 'my_models/__init__.py', 'my_models/net.py']
  assert result.stdout.strip().splitlines()[-1] == (
      f'worker: {worker / "trainer"} my_models.net {extra / "my_models" / "net.py"} '
      f'{extra / "extra_layer.py"} --config=default --workdir=gs://b/x '
      '--config.model=my_models.net:Net')


def test_tpu_pod_extra_files_refuses_a_missing_path_before_any_gcloud_call(tmp_path):
  _executable(tmp_path / 'bin' / 'gcloud', FAKE_GCLOUD)
  log = tmp_path / 'gcloud.log'
  (tmp_path / 'here.py').write_text('')
  env = dict(os.environ, PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}', GCLOUD_LOG=str(log),
             GCLOUD_FAILS='none')
  args = ['launch/tpu_pod.sh', '--name=t2', '--zone=z', '--accelerator_type=v4-8',
          '--config=default', '--workdir=gs://b/t2']
  missing = tmp_path / 'nowhere' / 'my_models'
  result = subprocess.run([*args, f'--extra_files={tmp_path / "here.py"},{missing}'],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.returncode == 2
  assert result.stderr.splitlines() == [
      f'error: --extra_files: {missing} does not exist (looked for from {REPO}); name '
      'files or folders that exist, comma-separated, e.g. --extra_files=my_models,layers.py']
  assert not log.exists() and result.stdout == ''
  twice = subprocess.run([*args, f'--extra_files={tmp_path / "here.py"},{tmp_path}/./here.py'],
                         cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60, check=False)
  assert twice.returncode == 2 and len(twice.stderr.splitlines()) == 1
  assert 'would both be ~/trainer_extra/here.py on the workers' in twice.stderr
  assert not log.exists()


# A python for local.sh that reports, for each trainer process, where it runs and whether the
# user's module in that directory imports (`-c` puts the working directory first, as `-m` does).
PROBE_PYTHON = '''#!/bin/bash
[[ "$1" == -m && "$2" == flax_dp_trainer.launch ]] && exec "$REAL_PYTHON" "$@"  # the launcher
exec "$REAL_PYTHON" -c 'import os, sys
import user_module_here
print("process", os.getcwd(), user_module_here.__file__, os.environ["PYTHONPATH"])'
'''


def test_local_launcher_runs_processes_where_it_is_started(tmp_path):
  """local.sh starts every process in the caller's working directory with PYTHONPATH as given,
  so a user's module there imports."""
  (tmp_path / 'user_module_here.py').write_text('')
  _executable(tmp_path / 'bin' / 'python', PROBE_PYTHON)
  env = dict(os.environ, PYTHON=str(tmp_path / 'bin' / 'python'), REAL_PYTHON=sys.executable,
             PYTHONPATH='/some/where')
  result = subprocess.run(
      [os.path.join(REPO, 'launch/local.sh'), '--num_processes=2', '--',
       '--config.model=user_module_here:Net'],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  assert sorted(result.stdout.splitlines()) == [
      f'[p{i}] process {tmp_path} {tmp_path / "user_module_here.py"} /some/where'
      for i in range(2)]
