"""A fork server for the commands a test runs as a reader would type them: `python -m
flax_dp_trainer...`, `python script.py` and `python -c CODE` start in a child forked from one
process that imported the libraries they need once (TensorFlow, JAX, torch: some 10 CPU-s of a
fresh interpreter's start on 2 cores), rather than in a fresh interpreter.

Each command still parses its own flags, runs with the caller's working directory, environment
and standard streams (passed over the socket), starts its own JAX backend, runs its atexit
handlers and ends with its own exit status, which the client (`tests/fork_client.py`) exits
with, or dies of the signal it died of. A signal the client gets (SIGINT, SIGTERM, SIGHUP) is
sent on to the command; a client that goes away takes the command's process group with it.
An environment that differs from the server's in what the libraries read as they import
(JAX_*, XLA_FLAGS, TF_*, ...) is answered `fallback`, and the client runs a fresh interpreter.

Run `python tests/fork_server.py SOCKET [MODULE...]`: imports each MODULE, then prints `ready`
and serves until it is killed.
"""

import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback

CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'fork_client.py')
# What the package's commands import, torchvision before TensorFlow as a process that holds
# both must (base/triton_guard.py); no module that defines absl flags (each command's own
# module defines them, once).
PRELOAD = ('torchvision', 'flax_dp_trainer.data.tensorflow_import', 'tensorflow_datasets',
           'flax_dp_trainer.edge.train', 'flax_dp_trainer.edge.checks')

# What the libraries read from the environment as they import (so the server's values hold in
# its children): a command whose environment differs in one of these runs in a fresh process.
IMPORT_TIME_ENVIRONMENT = ('JAX_', 'XLA_', 'TF_', 'TFDS_', 'PYTHON', 'LD_', 'CUDA', 'TORCH',
                           'OMP_', 'MKL_', 'KMP_', 'TRITON', 'NVIDIA_')


def client(path: str) -> list[str]:
  """What stands for `python` in a command line served by the server at socket `path`."""
  return [sys.executable, '-S', '-E', CLIENT, path, sys.executable]


def _differs_at_import(environment: dict, ours: dict) -> bool:
  return any(name.startswith(IMPORT_TIME_ENVIRONMENT) and environment.get(name) != ours.get(name)
             for name in set(environment) | set(ours))


def _reply(conn: socket.socket, **message) -> None:
  conn.sendall(json.dumps(message).encode() + b'\n')


def _session(conn: socket.socket, ours: dict, set_by_imports: dict):
  """One command's session, in a child of the server: the request read (refused where its
  environment differs from `ours`, the server's before its imports), the command forked (the
  returned request, its environment with what the imports set, in the command's process) and
  watched until it ends."""
  signal.signal(signal.SIGCHLD, signal.SIG_DFL)
  _, fds, _, _ = socket.recv_fds(conn, 1, 3)
  reader = conn.makefile('rb')
  request = json.loads(reader.readline())
  if _differs_at_import(request['env'], ours):
    _reply(conn, fallback=True)
    os._exit(0)
  pid = os.fork()
  if pid == 0:
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
      os.close(fd)
    reader.close()
    conn.close()
    request['env'] = {**set_by_imports, **request['env']}
    return request
  for fd in fds:
    os.close(fd)
  _reply(conn, pid=pid)
  buffered = b''
  while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      try:
        _reply(conn, status=status)
      except OSError:
        pass
      os._exit(0)
    readable, _, _ = select.select([conn], [], [], 0.05)
    if readable:
      data = conn.recv(64)
      if not data:  # The client is gone: so is its command, and what that started.
        try:
          os.killpg(pid, signal.SIGKILL)
        except OSError:
          pass
        os.waitpid(pid, 0)
        os._exit(0)
      buffered += data
      while b'\n' in buffered:
        line, buffered = buffered.split(b'\n', 1)
        try:
          os.kill(pid, int(line))
        except (OSError, ValueError):
          pass


def serve(path: str, preload) -> dict:
  """Serves forever in the server; returns a request in the process that runs it."""
  ours = dict(os.environ)
  for name in preload:
    importlib.import_module(name)
  # What the imports set in the environment (torch's CUDA_MODULE_LOADING, say): a fresh
  # interpreter's command would have it too.
  set_by_imports = {name: value for name, value in os.environ.items() if name not in ours}
  server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  server.bind(path)
  server.listen(64)
  signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # Sessions are reaped as they end.
  print('ready', flush=True)
  parent = os.getppid()
  while True:
    if not select.select([server], [], [], 1.0)[0]:
      if os.getppid() != parent:  # The test process is gone: so is its server.
        os._exit(0)
      continue
    conn, _ = server.accept()
    if os.fork() == 0:
      server.close()
      return _session(conn, ours, set_by_imports)
    conn.close()


def run(request: dict) -> int:
  """The command of `request`, as `python` runs it; its exit status."""
  os.chdir(request['cwd'])
  os.environ.clear()
  os.environ.update(request['env'])
  kind, target, argv = request['kind'], request['target'], request['argv']
  sys.argv = list(argv)
  try:
    if kind == 'module':
      sys.path[0] = os.getcwd()
      runpy.run_module(target, run_name='__main__', alter_sys=True)
    elif kind == 'script':
      sys.path[0] = os.path.dirname(os.path.abspath(target))
      runpy.run_path(target, run_name='__main__')
    else:
      sys.path[0] = ''
      # pylint: disable-next=exec-used
      exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})
  except SystemExit as e:  # As the interpreter ends: a message printed, status 1.
    if isinstance(e.code, int) or e.code is None:
      return e.code or 0
    print(e.code, file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    traceback.print_exc()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1
  return 0


class Server:
  """A fork server started from a test process (`command()` is what stands for `python` in a
  command line), stopped by `stop`."""

  def __init__(self, env: dict, preload=()):
    self._folder = tempfile.mkdtemp(prefix='fork-server-')  # (A socket's path is short.)
    self.path = os.path.join(self._folder, 'socket')
    self._process = subprocess.Popen([sys.executable, __file__, self.path, *preload],
                                     cwd=self._folder, env=env, stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
    if self._process.stdout.readline().strip() != 'ready':
      self.stop()
      raise RuntimeError('the fork server did not start')

  def command(self) -> list[str]:
    return client(self.path)

  def stop(self) -> None:
    try:
      os.killpg(self._process.pid, signal.SIGKILL)
    except OSError:
      pass
    self._process.wait()
    shutil.rmtree(self._folder, ignore_errors=True)


_STARTED: list[Server] = []


def python() -> list[str]:
  """What stands for `python` in a test's command line that trains or evaluates: this test
  process's fork server (started on first use, with the environment `processes.environment()`
  gives), its commands as fresh interpreters run them."""
  if not _STARTED:
    # pylint: disable-next=import-outside-toplevel  # (Not in the server, which runs this file.)
    from flax_dp_trainer.runs import processes
    _STARTED.append(Server(processes.environment(), PRELOAD))
  return _STARTED[0].command()


def stop_started() -> None:
  while _STARTED:
    _STARTED.pop().stop()


if __name__ == '__main__':
  sys.exit(run(serve(sys.argv[1], sys.argv[2:])))
