"""Launch scripts: the TPU pod commands, and argument errors."""

import os
import subprocess

import pytest

from scripts import processes


def _run(*args):
  return subprocess.run(list(args), cwd=processes.REPO, capture_output=True, text=True, timeout=60,
                        check=False)


def test_tpu_pod_dry_run_prints_the_gcloud_commands():
  result = _run('launch/tpu_pod.sh', '--name=r50', '--zone=us-central2-b',
                '--accelerator_type=v4-32', '--config=configs/imagenet_resnet50.py',
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
      'python3 -m trainer.main --config=configs/imagenet_resnet50.py '
      "--workdir=gs://bucket/r50 --config.tfds_data_dir=gs://bucket/tfds'",
      f'gcloud compute tpus tpu-vm delete r50 {where} --quiet',
  ]


def test_tpu_pod_keep_leaves_the_slice_and_bad_arguments_are_refused():
  kept = _run('launch/tpu_pod.sh', '--name=a', '--zone=z', '--accelerator_type=v4-8',
              '--config=configs/default.py', '--workdir=gs://b/a', '--keep', '--dry-run')
  assert kept.returncode == 0
  assert not any('delete' in line for line in kept.stdout.splitlines())
  local = _run('launch/tpu_pod.sh', '--name=a', '--zone=z', '--accelerator_type=v4-8',
               '--config=configs/default.py', '--workdir=/tmp/a', '--dry-run')
  assert local.returncode == 2
  assert local.stderr.startswith('error: --workdir=/tmp/a must be a gs:// path')
  missing = _run('launch/tpu_pod.sh', '--zone=z', '--dry-run')
  assert missing.returncode == 2 and missing.stderr.startswith('error: --name is required')


def test_local_launcher_refuses_bad_counts():
  result = _run('launch/local.sh', '--num_processes=0', '--', '--config=configs/default.py')
  assert result.returncode == 2
  assert "must be positive integers, got '0'" in result.stderr


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
       '--config=configs/default.py', '--workdir=gs://b/t1', *(['--keep'] if keep else [])],
      cwd=processes.REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
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
