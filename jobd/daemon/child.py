"""One daemon of several on a host (``processes`` over 1), as its supervisor starts it:
`jobd run CONFIG --process INDEX` (``daemon.supervisor``).

It is the daemon of ``loop``, whole — its own main loop, readers, recorder, ticker and
consumer — less what the supervisor does once for the host:

- it serves no endpoint: the supervisor serves /metrics, /healthz and the dashboard, and reads
  this daemon's series from the files it writes (``web.metrics``, ``SHARED``);
- it starts no embedded Redis: the supervisor runs it, this daemon connects to it;
- it tells the supervisor, never systemd, that it is ready, reloading or stopping, and that its
  loop turns (``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` name the supervisor's listener); and
  with each READY=1, which config text it runs (``X_JOBD_CONFIG``: the text's digest) and,
  after a reload, which text it read (``X_JOBD_READ``), whether it applied it or not.

Its consumer name ends in ``-pINDEX`` and its log lines say ``[pINDEX]``. Its standard input is
a pipe whose other end only the supervisor holds: should the supervisor die (SIGKILL), the
daemon reads its end and stops gracefully, as on SIGTERM, rather than run on unsupervised.

It gets no secret in its environment: the variables its config expands into secrets come on a
socket, read once it is non-dumpable (``daemon.handover``, in ``cli.main``). With the embedded
Redis it inherits the descriptor that locks the server (``embedded``) and keeps it, unused, to
its end (close-on-exec: no handler gets it): should the supervisor die, the server stays owned,
and no other `jobd` command stops it, while this daemon drains and records its outcomes there.
Its prometheus files are named after its index, not its pid (``supervised.metrics_identifier``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import replace

from prometheus_client import values

from jobd import hardening, logs
from jobd.config import Config
from jobd.daemon import lease
from jobd.daemon.loop import Daemon
from jobd.daemon.supervised import metrics_identifier
from jobd.web import metrics

log = logging.getLogger("jobd.daemon")


class ChildDaemon(Daemon):
    """The daemon, less the endpoint and the embedded Redis (the supervisor's)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.embedded = None  # the supervisor started it, and stops it after every daemon

    def open(self) -> None:
        """The daemon's, with no metrics listener: the supervisor serves the host's. The config
        in force stays the file's whole, so that a reload compares like with like."""
        whole = self.config
        self.config = replace(whole, metrics_listen=None)
        try:
            super().open()
        finally:
            self.config = whole

    def ready_fields(self, read: str | None = None) -> dict[str, str]:
        """Which text this daemon runs, after a reload too, and which text that reload read
        (applied or refused): the supervisor hands the text its daemons run to a daemon it
        starts again, and owes it a reload no daemon has answered (``handover.InForce``)."""
        fields = {"X_JOBD_CONFIG": self.config.digest}
        if read is not None:
            fields["X_JOBD_READ"] = read
        return fields


def watch_supervisor(fd: int = 0) -> None:
    """Stop gracefully (SIGTERM to this process) once ``fd``, the supervisor's pipe, ends: the
    supervisor is gone."""

    def wait() -> None:
        try:
            while os.read(fd, 512):
                pass
        except OSError:
            pass
        log.error("the supervisor is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="supervisor", daemon=True).start()


def run_child(config: Config, index: int, log_level: str = "INFO", log_format: str = "text") -> int:
    logs.setup(log_level, log_format, process=index)
    hardening.protect_process(config.path)  # before any handler starts
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # forked from a process without: now, and
        name = metrics_identifier(index)  # before any series: the files of pINDEX, any pid's
        values.ValueClass = values.MultiProcessValue(lambda: name)
        metrics.SHARED = True
    else:
        log.warning("PROMETHEUS_MULTIPROC_DIR is not set: the supervisor cannot see my metrics")
    lease.name_process(index)
    daemon = ChildDaemon(config)
    watch_supervisor()
    return daemon.run()
