"""The secrets a supervisor hands each daemon it starts, never through its environment.

A process's environment is readable by its user at ``/proc/PID/environ`` for as long as it is
dumpable, and a daemon the supervisor execs is dumpable until its interpreter has started and
``jobd`` made it non-dumpable (``hardening``): about 0.2 s in which a handler of a sibling
daemon, running as the same user, could read it. So the variables the config expands into
secrets (the supervisor took them out of its own environment: ``hardening.config_environ``)
go to the daemon on a socket instead:

- ``give`` (the supervisor, before each start): a connected pair of unix sockets; the
  supervisor writes the secrets (JSON) into its end and closes it, and the daemon inherits the
  other, named by ``JOBD_SECRETS_FD`` (a number, no secret). A socket, not a pipe nor a
  memfd: ``/proc/PID/fd/N`` of a socket cannot be opened, so even while the daemon is dumpable
  no other process can read what waits in it.
- ``take`` (the daemon, in ``cli.main``, after ``set_non_dumpable()`` and before the config is
  read): reads them, closes the socket, and gives them to ``hardening.remember``: the config is
  expanded with ``hardening.config_environ()``, at start and at each reload, and they never
  enter the daemon's environment, so its handlers cannot inherit them either.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, MutableMapping

VARIABLE = "JOBD_SECRETS_FD"
TIMEOUT = 10.0  # the supervisor wrote everything before the daemon started: EOF is there


def give(secrets: Mapping[str, str]) -> socket.socket:
    """The daemon's end of a socket pair that holds ``secrets``: pass its descriptor to the
    daemon (``VARIABLE`` names it) and close it here once the daemon is started."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ours.setblocking(False)  # a secret beyond the socket's buffer fails, never blocks
        ours.sendall(json.dumps(dict(secrets)).encode())
    except BlockingIOError as exc:
        theirs.close()
        raise OSError("the secrets to hand over do not fit in a socket's buffer") from exc
    finally:
        ours.close()  # the daemon reads to the end of the stream
    return theirs


def take(environ: MutableMapping[str, str] = os.environ) -> dict[str, str] | None:
    """The secrets the supervisor handed over (None when this process was given none), read
    from the descriptor ``VARIABLE`` names, which is closed, and ``VARIABLE`` unset."""
    named = environ.pop(VARIABLE, None)
    if not named or not named.isdigit():
        return None
    data = bytearray()
    with socket.socket(fileno=int(named)) as sock:
        sock.settimeout(TIMEOUT)
        while chunk := sock.recv(65536):
            data += chunk
    secrets = json.loads(data) if data else {}
    return {str(k): str(v) for k, v in secrets.items()}
