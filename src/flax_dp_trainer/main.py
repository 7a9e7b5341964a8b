"""Trains a model on a dataset, as a config says (`dp-train`, `python -m flax_dp_trainer`);
the same command again resumes it, `--eval_only` evaluates it.

  python -m flax_dp_trainer --config=default --workdir=/tmp/run [--cpu_devices=8] \\
      [--config.FIELD=VALUE ...]
"""

import os
import sys
import traceback
from typing import Optional

from flax_dp_trainer.base import cli
from flax_dp_trainer import logs
from flax_dp_trainer import settings

# Before TensorFlow is imported: its C++ start-up chatter stays out of the log.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
from absl import flags  # pylint: disable=wrong-import-position
from absl import logging  # pylint: disable=wrong-import-position

from flax_dp_trainer.base import multihost  # pylint: disable=wrong-import-position
from flax_dp_trainer.base import user_imports  # pylint: disable=wrong-import-position
from flax_dp_trainer.base.errors import (  # pylint: disable=wrong-import-position
    Diverged, Interrupted, Preempted, SaveFailed, UserError, storage_failure)
from flax_dp_trainer.elastic import faults  # pylint: disable=wrong-import-position
from flax_dp_trainer.elastic import timeline as timeline_lib  # pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Directory for metrics, checkpoints and the config.')
flags.DEFINE_integer(
    'cpu_devices', None,
    'Number of CPU devices to simulate (for machines without accelerators). Accelerators, '
    'when present, are still used; this only sizes the CPU backend.')
flags.DEFINE_string(
    'coordinator_address', None,
    'host:port of process 0 for a multi-process run started by hand. Unset: Cloud TPU pods '
    'and SLURM jobs of several tasks are detected; otherwise the run is single-process.')
flags.DEFINE_integer('num_processes', None, 'Processes in the run (with --coordinator_address).')
flags.DEFINE_integer('process_id', None, 'This process\'s index, 0..num_processes-1.')
flags.DEFINE_integer(
    'heartbeat_timeout_s', 20,
    'Seconds without a heartbeat after which the distributed runtime declares a process dead '
    'and stops the others (multi-process runs).')
flags.DEFINE_bool(
    'resume_with_changes', False,
    'Resume a checkpoint whose config differs in what defines the training stream or the '
    'model (batch size, seed, dataset, split, model); the log says where the stream '
    'continues. Without it such a resume is refused.')
flags.DEFINE_string('debug_fault', '', faults.FLAG_HELP)
flags.DEFINE_bool(
    'eval_only', False,
    'Evaluate the newest checkpoint of --workdir (else --config.init_from) on eval_split and '
    'every entry of eval_splits, write the scalars at its step, and stop; no checkpoint is '
    'changed.')
flags.DEFINE_string(
    'eval_step', None,
    'With --eval_only: the checkpoint to evaluate, a step number or \'best\' (the best '
    'evaluation\'s kept by --config.keep_best); default the newest.')
cli.define_config(
    'Training config: a shipped config by name (--config=default; --list=configs names them) '
    'or the path of a config file. Set any field with --config.FIELD=VALUE; --show_config '
    'prints every field, its value and what it does.')
flags.DEFINE_bool('show_config', False, 'Print every field of --config (after the '
                  '--config.FIELD overrides) with its value and comment, and exit.')
flags.DEFINE_bool('show_param_groups', False, 'Print each parameter of the model --config '
                  'builds (its path, shape, layer, learning-rate and weight-decay multipliers, '
                  'whether frozen) before anything compiles, and exit.')
flags.DEFINE_enum('list', None, list(settings.LISTS), 'Print the registered models, the named '
                  'datasets or the shipped configs, and exit.')


def _cluster_detected() -> bool:
  """A Cloud TPU pod slice or a SLURM job of several tasks: jax.distributed finds its peers."""
  if int(os.environ.get('SLURM_NTASKS', '1')) > 1:
    return True
  return len([h for h in os.environ.get('TPU_WORKER_HOSTNAMES', '').split(',') if h]) > 1


def _several_processes() -> bool:
  """Whether this process is one of several: started by hand with the process flags, or in a
  detected cluster."""
  return FLAGS.coordinator_address is not None or _cluster_detected()


def _import_user_code(config) -> None:
  """Imports the modules of `config.imports` and the model's module where `config.model` is
  an import path (`UserError` where one does not import or names nothing): before any
  dataset loads."""
  user_imports.import_modules(config)
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.model import source  # (flax: --list and --show_config need none)
  if source.is_import_path(config.model):
    source.resolve(config.model)


def _what_imports(config) -> str:
  """What `_import_user_code` imports, as a line naming a process that could not says it."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.model import source  # (flax, as above)
  named = [f'imports={config.imports!r}'] * bool(user_imports.names(config)) + (
      [f'model={config.model!r}'] * source.is_import_path(config.model))
  return 'import ' + ' and '.join(named or [f'imports={config.imports!r}'])


def _import_error(config):
  """The `UserError` of a module of `config.imports`, or of the model's import path, that
  does not import, else None."""
  try:
    _import_user_code(config)
  except UserError as e:
    return e
  return None


def _raise(error: Optional[Exception]) -> None:
  if error is not None:
    raise error


def _check_flags() -> None:
  """The device, process and evaluation flags, checked before anything starts."""
  if FLAGS.eval_step is not None and not FLAGS.eval_only:
    raise UserError(f'--eval_step={FLAGS.eval_step} names the checkpoint that --eval_only '
                    'evaluates; add --eval_only, or drop --eval_step')
  cli.checkpoint_step(FLAGS.eval_step, '--eval_step')
  if FLAGS.cpu_devices is not None and FLAGS.cpu_devices <= 0:
    raise UserError(f'--cpu_devices={FLAGS.cpu_devices} must be a positive device count, '
                    'e.g. --cpu_devices=8')
  explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise UserError('a multi-process run started by hand needs all of --coordinator_address, '
                      '--num_processes and --process_id (got '
                      f'{FLAGS.coordinator_address!r}, {FLAGS.num_processes!r}, '
                      f'{FLAGS.process_id!r})')
    if not 0 <= FLAGS.process_id < FLAGS.num_processes:
      raise UserError(f'--process_id={FLAGS.process_id} must be in 0..{FLAGS.num_processes - 1} '
                      f'for --num_processes={FLAGS.num_processes}')


def _start_distributed() -> None:
  explicit = (FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  if any(v is not None for v in explicit):
    jax.distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes,
                               FLAGS.process_id,
                               heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_s)
  elif _cluster_detected():
    jax.distributed.initialize(heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_s)


def _set_up_devices() -> None:
  if FLAGS.cpu_devices is not None:
    # Must happen before anything asks JAX for its devices.
    jax.config.update('jax_num_cpu_devices', FLAGS.cpu_devices)
  _start_distributed()
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.data import pipeline  # (TensorFlow: --list, --show_config need none)
  pipeline.keep_off_accelerators()


def _timeline() -> timeline_lib.Timeline:
  """This process's timeline from its start, before JAX knows the process index: the one
  given (--process_id, SLURM's), else 0."""
  index = FLAGS.process_id
  if index is None:
    index = int(os.environ.get('SLURM_PROCID', '0'))
  return timeline_lib.Timeline(FLAGS.workdir, index, faults.parse(FLAGS.debug_fault),
                               started=timeline_lib.process_started(), writes=index == 0)


def _exit(code: int, message: str) -> None:
  """Ends the process with `message` (a line 'error: ...' for what a restart does not cure:
  the launcher stops there)."""
  print(message, file=sys.stderr)
  if jax.distributed.is_initialized():
    # At exit jax.distributed waits for every process to shut down; one that failed alone
    # would wait for the others, and they for it. Leave now: the others' runtime sees the
    # missing heartbeats and stops them too.
    sys.stderr.flush()
    os._exit(code)  # pylint: disable=protected-access
  sys.exit(code)


def _answer_at_once() -> bool:
  """--list and --show_config, and a missing required flag: answered (True where done)
  before TensorFlow is imported or a JAX backend starts."""
  if FLAGS.list:
    print(settings.listing(FLAGS.list))
    return True
  cli.require('config')
  if FLAGS.show_config:
    try:  # A value a run refuses: the run's one line, status 2, not a traceback.
      text = settings.show_config(FLAGS.config, cli.config_path(),
                                  set(FLAGS['config'].override_values))
    except UserError as e:
      _exit(2, f'error: {e}')
    print(text)
    return True
  if FLAGS.show_param_groups:
    try:
      print(settings.show_param_groups(FLAGS.config))
    except UserError as e:
      _exit(2, f'error: {e}')
    return True
  cli.require('workdir')
  return False


def main(argv):
  del argv  # cli.parse_flags refused stray arguments.
  if _answer_at_once():
    return
  logging.get_absl_handler().addFilter(logs.quiet_libraries)
  # A damaged checkpoint is set aside and the run goes on: its abandoned reads say nothing.
  sys.unraisablehook = logs.quiet_abandoned_reads
  # (flax, optax: --list and --show_config answer without them)
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.edge import checks
  try:
    try:
      _check_flags()
      timeline = _timeline()
      config = checks.command_line_config(FLAGS['config'])
      # What the device count does not decide, checked before TensorFlow or a JAX backend
      # starts; the rest once the devices are known. A module of config.imports (or the
      # model's) that does not import on this process of several stops them all, once they
      # are connected.
      import_error = _import_error(config)
      datasets = None
      if import_error is None:
        # The check's datasets are handed on to the run: they are resolved once a start.
        datasets = checks.check_config(config, process_count=1, local_device_count=None,
                                       command_line=frozenset(FLAGS['config'].override_values),
                                       imported=True)
      elif not _several_processes():
        raise import_error
    except UserError as e:
      # The command line refused on what it says alone, before anything starts: status 2,
      # as a flag that does not parse (base/cli.py). Later refusals are status 1.
      _exit(2, f'error: {e}')
    # pylint: disable-next=import-outside-toplevel
    from flax_dp_trainer.edge import train  # (TensorFlow: a bad config is refused before it loads)
    from flax_dp_trainer.loop import setup
    _set_up_devices()
    if jax.process_count() > 1:  # Every process says how its imports went; one failed: all stop.
      multihost.on_every_process(lambda: _raise(import_error), _what_imports(config))
    logging.info('JAX process %d of %d; %d local and %d global %s devices',
                 jax.process_index(), jax.process_count(), jax.local_device_count(),
                 jax.device_count(), jax.default_backend())
    if config.compilation_cache_dir:  # Process-wide, so set here, before anything compiles.
      setup.use_compilation_cache(config.compilation_cache_dir)
    command_line = frozenset(FLAGS['config'].override_values)
    if not FLAGS.eval_only:
      try:  # What the devices decide, now that they are known: the command line's, status 2.
        checks.check_devices(config, process_count=jax.process_count(),
                             local_device_count=jax.local_device_count())
      except UserError as e:
        _exit(2, f'error: {e}')
    if FLAGS.eval_only:
      train.evaluate_only(config, FLAGS.workdir, command_line=command_line,
                          datasets=datasets,
                          step=cli.checkpoint_step(FLAGS.eval_step, '--eval_step'))
    else:
      train.train_and_evaluate(config, FLAGS.workdir, command_line=command_line,
                               timeline=timeline, datasets=datasets,
                               resume_with_changes=FLAGS.resume_with_changes)
  except (UserError, Diverged, SaveFailed) as e:
    _exit(1, f'error: {e}')
  except (Preempted, Interrupted) as e:  # (Ctrl-C: Interrupted, a KeyboardInterrupt)
    _exit(e.exit_code, str(e))
  except Exception as e:  # pylint: disable=broad-except
    refused = storage_failure(e)
    if refused:
      _exit(1, f'error: writing to {FLAGS.workdir} failed: {refused}; the checkpoints written '
               'before are kept: make room (or fix the path), then run the same command again '
               'to resume')
    if not jax.distributed.is_initialized():
      raise
    _exit(1, traceback.format_exc())


def run():
  """`python -m flax_dp_trainer` and the console script `dp-train`."""
  cli.run(main)

