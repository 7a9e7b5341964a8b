"""Entry-point commands run as `python -m` runs them, in children forked from one process that
loaded the libraries they import once: each command still parses its own flags, imports what
its config names, starts its own JAX backend and exits on its own, for a fraction of the
start-up of a fresh interpreter."""

import json
import subprocess
import sys

from flax_dp_trainer.runs import processes
from tests import REPO

# Runs each command of a JSON list [[cwd, module, *args], ...] as `python -m` would, in a
# child forked from this one after the libraries the entry points import are loaded (those
# every one needs, and the JSON list of argv[2]). Prints a JSON list of [exit status, stderr,
# stdout] per command.
_FORKED_COMMANDS = """
import importlib, json, os, runpy, sys, tempfile, traceback
import absl.app, absl.flags, absl.logging, flax, jax, ml_collections, numpy, optax
import ml_collections.config_flags

for name in json.loads(sys.argv[2]):
  importlib.import_module(name)
results = []
for cwd, module, *args in json.loads(sys.argv[1]):
  with tempfile.TemporaryFile('w+') as err, tempfile.TemporaryFile('w+') as out:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
      code = 1
      try:
        os.dup2(err.fileno(), 2)
        os.dup2(out.fileno(), 1)
        os.chdir(cwd)
        sys.path.insert(0, cwd)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name='__main__', alter_sys=True)
        code = 0
      except SystemExit as e:  # As the interpreter ends: a message is printed, status 1.
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
        if not isinstance(e.code, (int, type(None))):
          print(e.code, file=sys.stderr)
      except BaseException:
        traceback.print_exc()
      finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    err.seek(0)
    out.seek(0)
    results.append([os.waitstatus_to_exitcode(status), err.read(), out.read()])
print(json.dumps(results))
"""


def run(commands, preload=(), with_stdout=False) -> list[tuple]:
  """(exit status, stderr) of each [cwd, module, *args] of `commands` (with its stdout third
  where `with_stdout`), as `python -m` runs it, the modules of `preload` imported before."""
  result = subprocess.run(
      [sys.executable, '-c', _FORKED_COMMANDS, json.dumps(commands), json.dumps(preload)],
      cwd=REPO, env=processes.environment(), capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  results = json.loads(result.stdout.strip().splitlines()[-1])
  return [tuple(r) if with_stdout else tuple(r[:2]) for r in results]


def user_package(root, package: str, modules: dict) -> None:
  """A user's package `package` under the folder `root` (a pathlib.Path; the commands' cwd):
  an empty `__init__.py` and each {module name: source} of `modules`, for `config.imports`."""
  (root / package).mkdir()
  (root / package / '__init__.py').write_text('')
  for name, source in modules.items():
    (root / package / f'{name}.py').write_text(source)
