"""The supervisor of a host's daemons: `jobd run` when the config says ``processes`` over 1.

A daemon is one main loop, and one loop uses one core at most (the GIL): a host with more
cores runs more daemons. The supervisor starts ``processes`` of them, each `jobd run CONFIG
--process INDEX` forked by its fork server (``zygote``: never dumpable, never exec'd), each its
own consumer (``…-pINDEX``, see ``daemon.child``), and keeps them running:

    start the embedded Redis, if the config has one: once, for every daemon
    serve /metrics, /healthz and the dashboard for the host (``web.metrics.HostMetrics``)
    start daemon 1 … N, each in a process group of its own (Ctrl-C is passed on once)
    until stopped and every daemon has exited:
        wait for an event: a signal, a message from a daemon, a daemon's exit (its pidfd)
        SIGTERM/SIGINT: pass it on to every daemon, each drains (a second one: their handlers
            are stopped at once); tell systemd STOPPING
        SIGHUP: pass it on (each daemon reloads the file), tell systemd RELOADING
        a message (sd_notify, to this process's ``notify.Listener``): a daemon is ready,
            reloading or stopping, its loop turns (its watchdog), its status line
        a daemon that exited unasked: end what it left running, then start it again after a
            backoff; one that cannot start here (exit 78; 69 before it was ever ready; five
            times in a row unready): stop them all, exit with its status
        tell systemd READY once every daemon is ready, and pet its watchdog while none is stuck
    stop the embedded Redis; remove the private directory (metrics files, the socket)

A daemon as the supervisor sees it, its states and what its exit means: ``supervised``. What a
dead daemon leaves running, the supervisor ends before starting it again (``orphans``: it is a
child subreaper). Each daemon gets the secrets on a socket, never in its environment, with the
config its siblings run (``handover``); with the embedded Redis, it also inherits the server's
lock: the server stays owned while daemons drain, should the supervisor be SIGKILLed.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import tempfile
import time

from prometheus_client import multiprocess

from jobd import exitcodes, hardening, logs
from jobd.config import Config, ConfigError, load, read_text
from jobd.daemon import handover
from jobd.daemon.notify import Listener, Notifier
from jobd.daemon.orphans import Orphans
from jobd.daemon.poller import STOP_SIGNALS, Signals
from jobd.daemon.supervised import CLEAN, Child, State, describe, metrics_identifier
from jobd.daemon.zygote import Entry, Zygote
from jobd.embedded import EmbeddedServer
from jobd.web.dashboard import Dashboard
from jobd.web.endpoint import serve
from jobd.web.metrics import STUCK_AFTER, HostMetrics

log = logging.getLogger("jobd.supervisor")

IDLE_WAIT = 1.0


class Supervisor:
    """The daemons of one host, started, watched, restarted and stopped (module docstring)."""

    def __init__(self, config: Config, log_level: str, log_format: str, zygote: Zygote) -> None:
        self.config, self.zygote = config, zygote
        self.options = ["--log-level", log_level, "--log-format", log_format]
        self.children = [Child(i) for i in range(1, config.processes + 1)]
        self.notifier = Notifier.from_environ()
        self.signals = Signals()
        self.epoll = select.epoll()
        self.folder = tempfile.mkdtemp(prefix="jobd-")  # 0700: this user's alone
        self.metrics_dir = os.path.join(self.folder, "metrics")
        os.mkdir(self.metrics_dir, 0o700)
        self.listener = Listener(os.path.join(self.folder, "notify.sock"))
        self.desk = handover.Desk(os.path.join(self.folder, "secrets.sock"))
        self.metrics = HostMetrics(self.metrics_dir, self.healthy)
        self.lifeline_r, self.lifeline_w = os.pipe2(os.O_CLOEXEC)  # see daemon.child
        self.embedded = EmbeddedServer(config.redis.embedded) if config.redis.embedded else None
        self.stopping, self.announced = False, False  # announced: READY=1 since start/reload
        self.failed: int | None = None  # the exit status that ends the supervisor early
        self.heartbeat, self.shown_status = time.monotonic(), ""
        self.orphans = Orphans(self.own)
        self.in_force = handover.InForce(config.path, (self.reread() or (None, None))[0])

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        self.signals.install()
        try:
            if not self.open():
                return exitcodes.UNAVAILABLE
            while not self.finished():
                try:
                    self.step()
                except Exception:  # a bug here must not take the daemons down
                    log.exception("internal error in the supervisor's loop; going on")
                    time.sleep(0.1)
        finally:
            self.close()
        code = self.exit_code()
        log.info("supervisor stopped (%s)", describe(code))
        return code

    def open(self) -> bool:
        """The embedded Redis, the endpoint, then every daemon: all of them this process's
        children, and so is whatever a dead daemon leaves (``orphans``)."""
        self.orphans.adopt()
        if not self.orphans.enabled:  # the daemons the fork server starts would not be its own
            log.error("not a child subreaper: the daemons would not be this process's children")
            return False
        if self.embedded is not None:
            try:
                self.embedded.run_supervised()
            except RuntimeError as exc:
                log.error("cannot start the embedded Redis: %s", exc)
                return False
        if self.config.metrics_listen and not self.serve(self.config.metrics_listen):
            return False
        self.epoll.register(self.signals.fd, select.EPOLLIN)
        self.epoll.register(self.listener.fileno(), select.EPOLLIN)
        self.epoll.register(self.desk.fileno(), select.EPOLLIN)
        self.epoll.register(self.zygote.pidfd, select.EPOLLIN)
        for child in self.children:
            self.start(child)
        log.info("supervising %d daemon processes (%s) on %s", len(self.children),
                 ", ".join(f"p{c.index} pid {c.pid}" for c in self.children),
                 self.config.redis.describe())  # fmt: skip
        return True

    def serve(self, listen: str) -> bool:
        try:
            serve(self.metrics, listen, Dashboard(self.config))
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", listen, exc.strerror)
            return False
        return True

    def step(self) -> None:
        ready = {fd for fd, _ in self.epoll.poll(self.wait_time())}
        if self.signals.fd in ready:
            self.on_signals()
        if self.listener.fileno() in ready:
            self.on_messages()  # before exits: a daemon's last words are its own
        if self.desk.fileno() in ready:
            self.desk.serve(self.owes, self.in_force.handed)
        if self.zygote.pidfd in ready:
            self.on_zygote_exit()
        for child in self.children:
            if child.pidfd in ready:
                self.on_exit(child)
        self.orphans.reap()  # any adopted process that exited since (the supervisor may be PID 1)
        now = time.monotonic()
        for child in self.children:
            if not child.alive() and now >= child.restart_at:
                self.start(child)
                if child.alive():
                    self.metrics.restarts.labels(process=str(child.index)).inc()
        self.report(now)

    def wait_time(self) -> float:
        due = min(c.restart_at for c in self.children)
        if self.notifier.watchdog_interval is not None:
            due = min(due, self.notifier.next_watchdog)
        return max(0.0, min(due - time.monotonic(), IDLE_WAIT))

    def finished(self) -> bool:
        return self.stopping and not any(c.alive() for c in self.children)

    def close(self) -> None:
        """After the last daemon: the embedded Redis (after their outcomes), the files. If the
        loop failed, the daemons left are killed, and their handlers (adopted) with them."""
        left = [c for c in self.children if c.alive()]
        for child in left:
            child.signal(signal.SIGKILL)
        for child in left:
            child.reap()
            self.orphans.end(child.index)
        self.zygote.close()
        self.orphans.reap()
        if self.embedded is not None:
            self.embedded.stop()
        self.listener.close()
        self.desk.close()
        os.close(self.lifeline_w)
        os.close(self.lifeline_r)
        shutil.rmtree(self.folder, ignore_errors=True)

    def exit_code(self) -> int:
        if self.failed is not None:
            return self.failed
        unclean = any(c.code is not None and c.code not in CLEAN for c in self.children)
        return exitcodes.FAILURE if unclean else 0

    # -- the daemons --------------------------------------------------------------------

    def start(self, child: Child) -> None:
        """Start a daemon, owed its secrets (``handover``); if it fails, again after a backoff."""
        args = ["run", self.config.path, *self.options, "--process", str(child.index)]
        fds = {0: self.lifeline_r}
        if self.embedded is not None and self.embedded.lock_fd is not None:
            fds[self.embedded.lock_fd] = self.embedded.lock_fd
        env = handover.environment(self.listener.path, self.metrics_dir, self.desk.path)
        try:
            pid, gate = self.zygote.spawn(args, env, fds)
        except OSError as exc:
            return self.not_started(child, exc)
        with open(gate, "wb"):  # closed once drained for: the daemon goes on (``zygote``)
            try:  # connections made before it existed may bear its pid: refused first
                child.start(pid)
                child.reload_owed = self.in_force.pending()  # handed the text in force
                self.desk.serve(self.owes, self.in_force.handed, fresh=child.pid)
                self.epoll.register(child.pidfd, select.EPOLLIN)
            except Exception as exc:  # never a daemon owed its secrets, not drained for
                child.abandon() if child.alive() else None  # not started: killed, or not ours
                return self.not_started(child, exc)
        log.info("process p%d started: pid %d", child.index, child.pid)

    def not_started(self, child: Child, exc: Exception) -> None:
        delay = child.retry_later(time.monotonic(), ran=False)
        log.error("cannot start process p%d: %s; trying again in %gs", child.index, exc, delay)

    def owes(self, pid: int) -> bool:
        return any(child.fetches(pid) for child in self.children)

    def own(self) -> set[int]:
        """The pids of this process's own children: the live daemons, the embedded server, the
        fork server."""
        pids = {c.pid for c in self.children if c.alive()} | {self.zygote.pid}
        if self.embedded is not None and self.embedded.pid is not None:
            pids.add(self.embedded.pid)
        return pids

    def on_exit(self, child: Child) -> None:
        pid = child.pid
        self.epoll.unregister(child.pidfd)
        code = child.reap()
        self.orphans.end(child.index)  # its handlers, before a sibling may take their jobs
        multiprocess.mark_process_dead(metrics_identifier(child.index), self.metrics_dir)
        if self.stopping:
            level = logging.INFO if code in CLEAN else logging.WARNING
            log.log(level, "process p%d (pid %d) stopped: %s", child.index, pid, describe(code))
            return
        fatal = child.fatal(code)
        if fatal is not None:
            log.error("process p%d (pid %d) %s (%s): stopping every process, exiting %d",
                      child.index, pid, child.why_fatal(code), describe(code), fatal)  # fmt: skip
            self.failed = fatal
            self.begin_stop(signal.SIGTERM)
            return
        delay = child.retry_later(time.monotonic())
        log.error("process p%d (pid %d) exited unasked (%s): starting it again in %gs",
                  child.index, pid, describe(code), delay)  # fmt: skip

    def on_zygote_exit(self) -> None:
        """No daemon can be started again without it (``zygote``): stop, exit failed."""
        self.epoll.unregister(self.zygote.pidfd)
        if not self.stopping:
            log.error("the fork server (pid %d) is gone: no daemon can be started again; "
                      "stopping every process", self.zygote.pid)  # fmt: skip
            self.failed = exitcodes.FAILURE
            self.begin_stop(signal.SIGTERM)

    def on_messages(self) -> None:
        by_pid = {c.pid: c for c in self.children if c.alive()}
        for pid, fields in self.listener.receive():
            child = by_pid.get(pid)
            if child is not None:
                self.heard(child, fields)

    def heard(self, child: Child, fields: dict[str, str]) -> None:
        """What a daemon said (sd_notify): every message shows its loop turns."""
        child.seen, child.said_stuck = time.monotonic(), False
        if "STATUS" in fields:
            child.status = fields["STATUS"]
        if fields.get("STOPPING") == "1":
            child.state = State.STOPPING
        elif fields.get("RELOADING") == "1" and child.state is not State.STOPPING:
            child.state = State.RELOADING
        elif fields.get("READY") == "1" and child.state is not State.STOPPING:
            if child.state is State.STARTING:
                log.info("process p%d (pid %d) ready", child.index, child.pid)
            child.ready()
            if self.in_force.heard(fields.get("X_JOBD_CONFIG"), fields.get("X_JOBD_READ")):
                log.info("process p%d runs the reloaded config: it is in force", child.index)
            if child.reload_owed and not self.stopping:
                child.reload_owed = False
                child.state = State.RELOADING
                child.signal(signal.SIGHUP)

    # -- signals ------------------------------------------------------------------------

    def on_signals(self) -> None:
        for signum in self.signals.take():
            self.begin_stop(signum) if signum in STOP_SIGNALS else self.reload()

    def begin_stop(self, signum: int) -> None:
        """Pass the stop on: each daemon drains (a second time: stops its handlers now), for
        as long as it takes (systemd's TimeoutStopSec bounds that, as for one daemon)."""
        name = signal.Signals(signum).name
        if self.stopping:
            log.warning("%s again: passed on; the daemons stop their handlers now", name)
        else:
            self.stopping = True
            alive = sum(c.alive() for c in self.children)
            self.notifier.stopping(f"stopping; waiting for {alive} daemon process(es) to drain")
            log.info("%s: stopping; passed on to %d daemon process(es)", name, alive)
        for child in self.children:
            child.restart_at = float("inf")
            if not child.alive():
                child.code = None  # its crash was handled: a stop now is a clean one
            if child.alive():
                child.state = State.STOPPING
                child.signal(signum)

    def reload(self) -> None:
        """SIGHUP: every ready daemon reloads the file now; one still starting, once ready
        (before, SIGHUP would end it)."""
        if self.stopping:
            return
        self.notifier.reloading()
        self.announced = False  # READY=1 again once every daemon has reloaded
        for child in self.children:
            if child.state in (State.READY, State.RELOADING):
                child.state = State.RELOADING
                child.signal(signal.SIGHUP)
            elif child.state is State.STARTING:
                child.reload_owed = True
        log.info("SIGHUP: passed on to the daemon processes")
        found = self.reread()
        if found is None:  # the daemons report the file's problems themselves
            return
        text, new = found
        self.in_force.offer(text)  # in force once a daemon says it runs it
        handover.secrets(self.config.path, text)  # one the file now makes a secret: forgotten
        if new.processes != self.config.processes:  # read at start only
            log.warning("processes: %d in the file, %d running: a restart applies it",
                        new.processes, self.config.processes)  # fmt: skip

    def reread(self) -> tuple[str, Config] | None:
        """The config file's text and config if it loads now."""
        try:
            text = read_text(self.config.path)
            return text, load(self.config.path, hardening.config_environ(), text)
        except ConfigError:
            return None

    # -- what the supervisor tells --------------------------------------------------------

    def report(self, now: float) -> None:
        """READY to systemd once every daemon is; its watchdog while none is stuck; STATUS."""
        self.heartbeat = now
        everyone = all(c.state is State.READY for c in self.children)
        if everyone and not self.stopping and not self.announced:
            self.announced = True
            self.notifier.ready(self.status_line())
            log.info("ready: %d daemon processes", len(self.children))
        stuck = [c for c in self.children if c.stuck(now, STUCK_AFTER)]
        for child in stuck:
            if not child.said_stuck:
                child.said_stuck = True
                log.error("process p%d (pid %d): no word for %gs, its main loop is stuck",
                          child.index, child.pid, STUCK_AFTER)  # fmt: skip
        if not stuck:
            self.notifier.watchdog(now)  # a stuck daemon stops it: systemd restarts the lot
        status = self.status_line()
        if status != self.shown_status and self.announced:
            self.shown_status = status
            self.notifier.status(status)

    def status_line(self) -> str:
        return " | ".join(f"p{c.index}: {c.status if c.alive() else 'restarting'}"
                         for c in self.children)  # fmt: skip

    def healthy(self) -> bool:
        """For /healthz (another thread): this loop turns, every daemon is ready and turns."""
        now = time.monotonic()
        return (
            not self.stopping
            and now - self.heartbeat < STUCK_AFTER
            and all(c.state in (State.READY, State.RELOADING) and not c.stuck(now, STUCK_AFTER)
                    for c in self.children)
        )  # fmt: skip


def supervise(config: Config, log_level: str, log_format: str, entry: Entry) -> int:
    """The supervisor's run; each daemon runs ``entry`` (``cli.main``) with its arguments."""
    logs.setup(log_level, log_format)
    hardening.protect_process(config.path)  # before any daemon or Redis starts
    try:
        zygote = Zygote.fork(entry)  # before any thread starts, non-dumpable, holding no secret
    except OSError as exc:
        log.error("cannot start the fork server: %s", exc)
        return exitcodes.UNAVAILABLE
    try:
        supervisor = Supervisor(config, log_level, log_format, zygote)
    except OSError as exc:  # $TMPDIR not writable, a socket path too long
        zygote.close()
        log.error("cannot make the supervisor's private directory: %s", exc)
        return exitcodes.UNAVAILABLE
    return supervisor.run()
