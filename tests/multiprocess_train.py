"""Trains several topology-comparison runs in one multi-process job, so that the processes
start (and import TensorFlow and JAX) once for all of them. Used by tests/parallel/test_topology.py:

  python -m tests.multiprocess_train --coordinator_address=127.0.0.1:PORT --num_processes=2 \
      --process_id=I --cpu_devices=2 --root=DIR --tfds_data_dir=DIR --runs=cnn:pmap,resnet_tiny:shard_map

Each run MODEL:BACKEND trains `helpers.topology_config` into ROOT/MODEL_BACKEND.
"""

import os

import jax
from absl import app
from absl import flags

from flax_dp_trainer.edge import train
from tests import helpers

FLAGS = flags.FLAGS
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0.')
flags.DEFINE_integer('num_processes', 2, 'Processes in the job.')
flags.DEFINE_integer('process_id', 0, 'This process.')
flags.DEFINE_integer('cpu_devices', 2, 'Simulated CPU devices per process.')
flags.DEFINE_string('root', None, 'Workdirs go here, one per run.')
flags.DEFINE_string('tfds_data_dir', None, 'TFDS data dir holding digits.')
flags.DEFINE_list('runs', [], 'MODEL:BACKEND pairs.')


def main(argv):
  del argv
  jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  for run in FLAGS.runs:
    model, backend = run.split(':')
    train.train_and_evaluate(helpers.topology_config(FLAGS.tfds_data_dir, model, backend),
                             os.path.join(FLAGS.root, f'{model}_{backend}'))


if __name__ == '__main__':
  app.run(main)
