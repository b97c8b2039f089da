"""One daemon of several on a host (``processes`` over 1), as its supervisor starts it:
`jobd run CONFIG --process INDEX` (``daemon.supervisor``).

It is the daemon of ``loop``, whole — its own main loop, readers, recorder, ticker and
consumer — less what the supervisor does once for the host:

- it serves no endpoint: the supervisor serves /metrics, /healthz and the dashboard, and reads
  this daemon's series from the files it writes (``web.metrics``, ``SHARED``);
- it starts no embedded Redis: the supervisor runs it, this daemon connects to it;
- it tells the supervisor, never systemd, that it is ready, reloading or stopping, and that its
  loop turns (``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` name the supervisor's listener).

Its consumer name ends in ``-pINDEX`` and its log lines say ``[pINDEX]``. Its standard input is
a pipe whose other end only the supervisor holds: should the supervisor die (SIGKILL), the
daemon reads its end and stops gracefully, as on SIGTERM, rather than run on unsupervised.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import replace

from jobd import hardening, logs
from jobd.config import Config
from jobd.daemon import lease
from jobd.daemon.loop import Daemon
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
    if not metrics.SHARED:
        log.warning("PROMETHEUS_MULTIPROC_DIR is not set: the supervisor cannot see my metrics")
    lease.name_process(index)
    daemon = ChildDaemon(config)
    watch_supervisor()
    return daemon.run()
