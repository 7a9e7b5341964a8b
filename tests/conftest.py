"""Eight simulated CPU devices for the whole session; tests use all or a prefix of them."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import pytest  # pylint: disable=wrong-import-position

NUM_DEVICES = 8
# Must run before anything asks JAX for devices; conftest is imported before any test module.
jax.config.update('jax_num_cpu_devices', NUM_DEVICES)


@pytest.fixture(scope='session')
def tfds_data_dir(tmp_path_factory):
  """A TFDS data dir private to the test session (digits is prepared there on first use)."""
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture
def config(tfds_data_dir):
  """The default config reading from the session's TFDS data dir."""
  from configs import default  # pylint: disable=import-outside-toplevel
  cfg = default.get_config()
  cfg.tfds_data_dir = tfds_data_dir
  return cfg
