"""Eight simulated CPU devices for the whole session; tests use all or a prefix of them.

The suite's time goes mostly to XLA compiles, so for the tests (and the processes they
start, which inherit this environment):
  * LLVM optimizes the compiled code less (`--xla_backend_optimization_level=0`): compiles
    take about a third less, and the tests' small steps run about as fast;
  * XLA:CPU emits fusions with its older LLVM emitters rather than the MLIR ones
    (`--xla_cpu_use_fusion_emitters=false`): a train step compiles in under half the CPU time
    (7.3 to 3.3 CPU-s for four steps); users' runs keep XLA's defaults;
  * compiled programs go to a persistent compilation cache shared by the session's workers
    and subprocesses, so a program that several tests compile (a model's init, an eval step)
    is compiled once.
"""

import os
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ['XLA_FLAGS'] = ' '.join(
    [os.environ.get('XLA_FLAGS', ''), '--xla_backend_optimization_level=0',
     '--xla_cpu_use_fusion_emitters=false']).strip()
# One cache per test run: xdist gives its workers the run's id.
COMPILATION_CACHE = os.path.join(
    tempfile.gettempdir(),
    f'flax-dp-trainer-tests-{os.environ.get("PYTEST_XDIST_TESTRUNUID", os.getpid())}')
os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', COMPILATION_CACHE)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')
# The image folders' check caches (data/file_check.py) of the run's generated folders,
# beside it rather than in the user's ~/.cache.
FILE_CHECK_CACHE = COMPILATION_CACHE + '-file-checks'
os.environ.setdefault('FLAX_DP_TRAINER_CACHE_DIR', FILE_CHECK_CACHE)

import pytest  # pylint: disable=wrong-import-position

from tests import fork_server  # pylint: disable=wrong-import-position

NUM_DEVICES = 8


def _prepare_test_process() -> None:
  """What a process that runs tests needs before any test module is imported."""
  # torchvision 0.29.1 crashes the interpreter (SIGSEGV) when imported after TensorFlow 2.21;
  # imported before, both work. A worker runs many test files, some of which load TensorFlow
  # first: import torchvision before any of them.
  import torchvision  # pylint: disable=import-outside-toplevel,unused-import
  import jax  # pylint: disable=import-outside-toplevel
  # Must run before anything asks JAX for devices: test modules are imported after this.
  jax.config.update('jax_num_cpu_devices', NUM_DEVICES)


def pytest_collection_modifyitems(items):
  """The files with the most `slow` tests (whole runs, subprocess jobs) first: xdist hands out
  whole files (--dist loadfile) in collection order, and a long file handed out last leaves
  the other worker idle while it runs. Within a file, collection order."""
  slow = {}
  for item in items:
    slow[item.path] = slow.get(item.path, 0) + int(item.get_closest_marker('slow') is not None)
  order = {path: rank for rank, path in enumerate(sorted(slow, key=lambda p: -slow[p]))}
  items.sort(key=lambda item: order[item.path])


# A test process that dies (os.abort, a native crash, the OOM killer) ends the run at once,
# naming its test: xdist does not replace it (--max-worker-restart=0), and the surviving worker
# is stopped too rather than left to run the files queued for it. Workers record their pids
# where the controller finds them (xdist's own channel to a busy worker waits for its test).
_WORKER_PIDS = 'TESTS_WORKER_PIDS_DIR'
_CRASHED: list[str] = []


def pytest_configure(config):
  workerinput = getattr(config, 'workerinput', None)
  # xdist's controller neither collects nor runs tests, and needs neither import (7 CPU-s on
  # a 2-core machine, while the workers collect); with --collect-only it collects itself.
  # Workers are started where xdist's own test says so: a --dist mode and --tx hosts (-n N).
  distributing = config.getoption('dist', 'no') != 'no' and bool(config.getoption('tx', None))
  if workerinput is not None or not distributing or config.getoption('collectonly'):
    _prepare_test_process()
  if workerinput is None:
    if _WORKER_PIDS not in os.environ:
      os.environ[_WORKER_PIDS] = tempfile.mkdtemp(prefix='flax-dp-trainer-workers-')
  elif os.environ.get(_WORKER_PIDS):
    with open(os.path.join(os.environ[_WORKER_PIDS], workerinput['workerid']), 'w',
              encoding='utf-8') as f:
      f.write(str(os.getpid()))


def pytest_handlecrashitem(crashitem, report, sched):
  """xdist's hook (in the controller) for a test whose worker died."""
  if _CRASHED:  # A survivor stopped below: its test did not fail, the run stopped.
    report.outcome = 'skipped'
    report.longrepr = (crashitem.split('::')[0], 0, 'not finished: the run stopped when the '
                       f'process running {_CRASHED[0]} died')
    return
  _CRASHED.append(crashitem)
  print(f'\nerror: the test process running {crashitem} died; stopping the run',
        file=sys.stderr, flush=True)
  for node in sched.nodes:
    try:
      with open(os.path.join(os.environ[_WORKER_PIDS], node.gateway.id), encoding='utf-8') as f:
        os.kill(int(f.read()), signal.SIGKILL)
    except (OSError, ValueError):
      pass


# The suite's budget (docs/tests.md), on a 2-core machine: the fast tier alone
# (`-m "not slow" -n 2`) and the whole suite (as `.ci/run` runs it, the install aside), in
# seconds of wall time; and the most one test of each tier may take (its setup, call and
# teardown). A test over its tier's limit, and a run over its budget, are named at the end.
BUDGET_S = {'the fast tier': 240.0, 'the whole suite': 1350.0}
PER_TEST_LIMIT_S = {'fast': 8.0, 'slow': 150.0}
SLOWEST_SHOWN = 25
_DURATIONS: dict[str, list] = {}  # nodeid -> [seconds, tier], summed over its phases.
_STARTED: list[float] = []


def pytest_sessionstart(session):
  del session
  _STARTED.append(time.monotonic())


def pytest_runtest_logreport(report):
  """Each phase's duration, in the process that reports (xdist's controller, or the only
  one)."""
  tier = 'slow' if 'slow' in report.keywords else 'fast'
  _DURATIONS.setdefault(report.nodeid, [0.0, tier])[0] += report.duration


def pytest_terminal_summary(terminalreporter, config):
  """The slowest tests, each tier's total, the tests over their tier's limit and the run
  against its budget."""
  if hasattr(config, 'workerinput') or not _DURATIONS:
    return
  write = terminalreporter.write_line
  terminalreporter.section("the suite's budget (docs/tests.md)")
  ranked = sorted(_DURATIONS.items(), key=lambda kv: -kv[1][0])
  write(f'slowest {min(SLOWEST_SHOWN, len(ranked))} tests (setup + call + teardown):')
  for nodeid, (seconds, tier) in ranked[:SLOWEST_SHOWN]:
    write(f'  {seconds:7.1f} s  {tier}  {nodeid}')
  for tier in ('fast', 'slow'):
    times = [s for s, t in _DURATIONS.values() if t == tier]
    if times:
      write(f'{tier} tier: {len(times)} tests, {sum(times):.0f} s of test time; '
            f'per-test limit {PER_TEST_LIMIT_S[tier]:g} s')
  over = [(n, s, t) for n, (s, t) in ranked if s > PER_TEST_LIMIT_S[t]]
  for nodeid, seconds, tier in over:
    write(f'over the {tier} tier\'s limit of {PER_TEST_LIMIT_S[tier]:g} s: {seconds:.1f} s  '
          f'{nodeid}', yellow=True)
  wall = time.monotonic() - _STARTED[0]
  if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.keyword:
    # Some files, or some tests by -k: no tier's budget.
    write(f'this run: {wall:.0f} s of wall time')
    return
  tiers = {t for _, t in _DURATIONS.values()}
  run = {frozenset({'fast'}): 'the fast tier', frozenset({'slow'}): 'the slow tier'}.get(
      frozenset(tiers), 'the whole suite')
  if run not in BUDGET_S:  # (The slow tier alone has no budget of its own.)
    write(f'{run}: {wall:.0f} s of wall time')
    return
  write(f'{run}: {wall:.0f} s of wall time, budget {BUDGET_S[run]:g} s'
        + (' (over)' if wall > BUDGET_S[run] else ''), yellow=wall > BUDGET_S[run])


def pytest_sessionfinish(session):
  """Each test process stops the fork server it started (`tests/fork_server.python`); the
  process that ran the session (xdist's controller, or the only one) removes the cache once
  every worker is done."""
  fork_server.stop_started()
  if not hasattr(session.config, 'workerinput'):
    shutil.rmtree(COMPILATION_CACHE, ignore_errors=True)
    shutil.rmtree(FILE_CHECK_CACHE, ignore_errors=True)
    shutil.rmtree(os.environ.get(_WORKER_PIDS, ''), ignore_errors=True)


@pytest.fixture(scope='session')
def tfds_data_dir(tmp_path_factory):
  """A TFDS data dir private to the test session (digits is prepared there on first use)."""
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='module')
def one_rank_group():
  """A torch process group of this process alone (gloo over loopback): the DDP twin's code
  run in the test process."""
  # Imported by the test processes only: xdist's controller loads none (`pytest_configure`).
  import torch.distributed as dist  # pylint: disable=import-outside-toplevel
  from flax_dp_trainer.base import ports  # pylint: disable=import-outside-toplevel
  dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{ports.free_port()}',
                          rank=0, world_size=1)
  yield
  dist.destroy_process_group()


@pytest.fixture
def config(tfds_data_dir):
  """The default config reading from the session's TFDS data dir."""
  # pylint: disable-next=import-outside-toplevel
  from flax_dp_trainer.configs import default  # (as above)
  cfg = default.get_config()
  cfg.tfds_data_dir = tfds_data_dir
  return cfg
