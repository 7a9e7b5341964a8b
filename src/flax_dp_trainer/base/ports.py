"""A free TCP port on this machine's loopback, for a coordinator or a rendezvous that a
program started here listens on (the launcher's, the tools', the tests')."""

import socket


def free_port() -> int:
  """A TCP port nothing listens on now on 127.0.0.1."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]
