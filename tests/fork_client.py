"""`python` for a test's commands, through the fork server (`tests/fork_server.py`):
`python -S -E tests/fork_client.py SOCKET INTERPRETER ARGS...` runs `INTERPRETER ARGS...` in a
child of the server where ARGS are `-m flax_dp_trainer...`, `-c CODE` or `SCRIPT.py`, and as
INTERPRETER itself otherwise (or where the server says so). Standard library only: it starts
in milliseconds."""

import json
import os
import signal
import socket
import sys


def _request(args: list[str]):
  if len(args) >= 2 and args[0] == '-m' and args[1].split('.')[0] == 'flax_dp_trainer':
    return dict(kind='module', target=args[1], argv=[args[1], *args[2:]])
  if len(args) >= 2 and args[0] == '-c':
    return dict(kind='code', target=args[1], argv=['-c', *args[2:]])
  if args and args[0].endswith('.py') and os.path.isfile(args[0]):
    return dict(kind='script', target=args[0], argv=args)
  return None


def main() -> None:
  path, interpreter, *args = sys.argv[1:]
  request = _request(args)
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try:
    if request is None:
      raise OSError
    conn.connect(path)
  except OSError:
    os.execv(interpreter, [interpreter, *args])
  request.update(cwd=os.getcwd(), env=dict(os.environ))
  socket.send_fds(conn, [b'F'], [0, 1, 2])
  conn.sendall(json.dumps(request).encode() + b'\n')
  replies = conn.makefile('rb')
  first = json.loads(replies.readline())
  if first.get('fallback'):
    os.execv(interpreter, [interpreter, *args])

  def forward(signum, frame):
    del frame
    conn.sendall(f'{signum}\n'.encode())

  for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, forward)
  status = json.loads(replies.readline())['status']
  if os.WIFSIGNALED(status):
    signum = os.WTERMSIG(status)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
  sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == '__main__':
  main()
