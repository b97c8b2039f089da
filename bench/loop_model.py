"""What bounds one loop that starts and reaps handlers: a model of jobd's loop, side by side.

    python bench/loop_model.py [--jobs 5000] [--rounds 5] [--work-us 100] [--side-us 0]
                               [--modes vfork,forkserver]

The daemon's loop starts each handler and waits until the vfork child has called exec; on a
busy machine that wait is mostly the child waiting for a CPU. This model is the loop alone:
for each job two output pipes, a start, a pidfd in an epoll, reaping, closing; ``--work-us``
of Python CPU at the start and again at the end of each job stands in for the rest of the
loop's work (the daemon's loop costs about 0.2 ms a job all told: ``--work-us 100``), and
``--side-us`` of Python CPU a job, spent by a second thread that wakes every 5 ms, stands in
for the reader and recorder (about 0.1 ms a job). No Redis. Each round runs, one after the
other:

  xargs       `seq N | xargs -P8 -n1 /bin/true`, the baseline (also run again at the end of
              the round: the ratios are to the mean of the two);
  vfork       the loop starting each handler with jobd's vfork spawn (``jobd.process.spawn``:
              vfork and exec, the GIL released while it waits), as the daemon did before
              its C extension;
  clone       (``--modes``) jobd's spawn as the daemon calls it: a clone the loop does not
              wait for (``jobd.process._clonexec``), where the extension is built;
  forkserver  (where a C compiler is found) the loop sending each start to a small C
              process, which clones the handler with CLONE_PARENT (so it is the loop's own
              child, reaped and watched by pidfd as before) and never waits for its exec; the
              loop learns the pid from the reply on a socket, in a later pass;
  sync        (``--modes``) the same fork server, the loop waiting for each reply (the pid
              at once, as the daemon's code expects it today);
  thread      (``--modes``) jobd's vfork spawn in a spawner thread of the loop's process, each
              start handed over on a deque and an eventfd, each pid handed back likewise.

It prints per round jobs/s and the ratio to xargs, how long the loop spent in each start call
(p50, p90: for vfork that is the wait for exec), how busy the machine was, and the medians.
A prototype to judge an architecture step by, not jobd code: the fork server reports a failed
exec only as exit status 127.
"""

from __future__ import annotations

import argparse
import array
import collections
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from jobd.process import spawn  # this checkout's (the path above), not an installed one

FORKSERVER_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* A request: argv then env, each string NUL-terminated, each list ended by an empty one;
   stdin, stdout, stderr attached. Reply: the child's pid, or -errno. */
static char buf[1 << 20];

int main(int argc, char **av) {
    int sock = argc > 1 ? atoi(av[1]) : 3;
    static char *args[4096], *envs[4096];
    for (;;) {
        struct iovec iov = {buf, sizeof buf - 2};
        union { struct cmsghdr h; char space[CMSG_SPACE(3 * sizeof(int))]; } c;
        struct msghdr m = {0};
        m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = &c; m.msg_controllen = sizeof c;
        ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (n <= 0) { if (n < 0 && errno == EINTR) continue; return 0; }
        buf[n] = 0; buf[n + 1] = 0;
        int fds[3] = {-1, -1, -1};
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        if (h && h->cmsg_type == SCM_RIGHTS) memcpy(fds, CMSG_DATA(h), sizeof fds);
        int na = 0, ne = 0; char *p = buf, *end = buf + n;
        while (p < end && *p && na < 4095) { args[na++] = p; p += strlen(p) + 1; }
        args[na] = 0; p++;
        while (p < end && *p && ne < 4095) { envs[ne++] = p; p += strlen(p) + 1; }
        envs[ne] = 0;
        long pid = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) {
            close(sock);
            for (int i = 0; i < 3; i++) {
                if (fds[i] != i) dup2(fds[i], i); else fcntl(i, F_SETFD, 0);
            }
            setpgid(0, 0);
            execve(args[0], args, envs);
            _exit(127);
        }
        int32_t reply = pid < 0 ? -errno : (int32_t)pid;
        for (int i = 0; i < 3; i++) if (fds[i] >= 0) close(fds[i]);
        if (send(sock, &reply, sizeof reply, 0) < 0) return 1;
    }
}
"""

HANDLER = "/bin/true"
ENV = {"PATH": "/usr/bin:/bin", "JOBD_QUEUE": "noop"}


def build_forkserver(workdir: Path) -> Path | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None
    source, binary = workdir / "forkserver.c", workdir / "forkserver"
    source.write_text(FORKSERVER_C)
    done = subprocess.run([compiler, "-O2", "-o", str(binary), str(source)], capture_output=True)
    return binary if done.returncode == 0 else None


class Loop:
    """One thread starting ``/bin/true`` handlers eight at a time, as jobd's loop does."""

    def __init__(self, mode: str, work: float, side: float, forkserver: str | None) -> None:
        self.mode, self.work, self.side = mode, work, side
        self.epoll = select.epoll()
        self.leaders: dict[int, tuple[int, int]] = {}  # pidfd -> its output pipes
        self.outputs: set[int] = set()
        self.waiting: list[tuple[int, int]] = []  # output pipes of starts sent, not answered
        self.calls: list[float] = []
        self.null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        self.done = 0
        self.stop = threading.Event()
        if mode == "thread":  # a spawner thread: the loop hands each start over, never waits
            self.requests: collections.deque[tuple[int, int, int, int]] = collections.deque()
            self.results: collections.deque[tuple[int, int, int]] = collections.deque()
            self.wake = os.eventfd(0, os.EFD_CLOEXEC)
            self.told = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            self.epoll.register(self.told, select.EPOLLIN)
            threading.Thread(target=self.spawner, daemon=True).start()
        if mode in ("forkserver", "sync"):
            assert forkserver
            self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.server = subprocess.Popen(
                [forkserver, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            theirs.close()
            self.epoll.register(self.sock.fileno(), select.EPOLLIN)
            self.request = (
                f"{HANDLER}\0\0".encode() + b"".join(f"{k}={v}\0".encode() for k, v in ENV.items())
                + b"\0"
            )  # fmt: skip

    def burn(self, seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def side_thread(self) -> None:
        """The reader and recorder: woken every 5 ms, some Python CPU for each job since."""
        seen = 0
        while not self.stop.wait(0.005):
            now = self.done
            self.burn(self.side * (now - seen))
            seen = now

    def start(self) -> None:
        self.burn(self.work)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        began = time.perf_counter()
        if self.mode == "thread":
            self.requests.append((out_r, err_r, out_w, err_w))
            os.eventfd_write(self.wake, 1)
            self.calls.append(time.perf_counter() - began)
            return
        if self.mode in ("forkserver", "sync"):
            fds = array.array("i", [self.null, out_w, err_w])
            self.sock.sendmsg([self.request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            self.waiting.append((out_r, err_r))
            if self.mode == "sync":  # the pid now: the loop waits for the clone, not the exec
                self.sock.setblocking(True)
                reply = self.sock.recv(4)
                self.watch(int.from_bytes(reply, "little", signed=True), self.waiting.pop(0))
        elif self.mode == "clone":
            pid, report = spawn.spawn((HANDLER,), ENV, {}, None, out_w, err_w)
            if report is not None:  # a failed exec is only exit status 127 here
                os.close(report)
            self.watch(pid, (out_r, err_r))
        else:
            pid = spawn._vfork_exec((HANDLER,), spawn._encode(ENV), None, out_w, err_w)
            self.watch(pid, (out_r, err_r))
        self.calls.append(time.perf_counter() - began)
        os.close(out_w)
        os.close(err_w)

    def spawner(self) -> None:
        """The spawner thread: each start handed over, the pid handed back (an eventfd)."""
        while True:
            os.eventfd_read(self.wake)
            while self.requests:
                out_r, err_r, out_w, err_w = self.requests.popleft()
                pid = spawn._vfork_exec((HANDLER,), spawn._encode(ENV), None, out_w, err_w)
                os.close(out_w)
                os.close(err_w)
                self.results.append((pid, out_r, err_r))
                os.eventfd_write(self.told, 1)

    def spawned(self) -> None:
        os.eventfd_read(self.told)
        while self.results:
            pid, out_r, err_r = self.results.popleft()
            self.watch(pid, (out_r, err_r))

    def watch(self, pid: int, pipes: tuple[int, int]) -> None:
        pidfd = os.pidfd_open(pid)
        self.leaders[pidfd] = pipes
        self.epoll.register(pidfd, select.EPOLLIN)
        for fd in pipes:
            self.epoll.register(fd, select.EPOLLIN)
            self.outputs.add(fd)

    def reap(self, pidfd: int) -> None:
        pipes = self.leaders.pop(pidfd)
        self.epoll.unregister(pidfd)
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
        os.close(pidfd)
        for fd in pipes:
            self.epoll.unregister(fd)
            self.outputs.discard(fd)
            os.read(fd, 4096)
            os.close(fd)
        self.burn(self.work)
        self.done += 1

    def run(self, jobs: int) -> float:
        side = threading.Thread(target=self.side_thread, daemon=True)
        if self.side:
            side.start()
        started = 0
        began = time.perf_counter()
        while self.done < jobs:
            while started < jobs and started - self.done < 8:
                self.start()
                started += 1
            for fd, _ in self.epoll.poll():
                if self.mode in ("forkserver", "sync") and fd == self.sock.fileno():
                    self.answers()
                elif self.mode == "thread" and fd == self.told:
                    self.spawned()
                elif fd in self.leaders:
                    self.reap(fd)
                elif fd in self.outputs:
                    os.read(fd, 4096)
        rate = jobs / (time.perf_counter() - began)
        self.stop.set()
        return rate

    def answers(self) -> None:
        while True:
            try:
                reply = self.sock.recv(4, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            pid = int.from_bytes(reply, "little", signed=True)
            if pid < 0:
                sys.exit(f"forkserver: cannot start: {os.strerror(-pid)}")
            self.watch(pid, self.waiting.pop(0))


def busy() -> tuple[int, int]:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, idle


def measure(cmd: list[str]) -> tuple[dict[str, float], float]:
    before = busy()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = busy()
    worked, idle = after[0] - before[0], after[1] - before[1]
    return json.loads(out), worked / max(1, worked + idle)


def xargs_rate(jobs: int) -> float:
    began = time.perf_counter()
    subprocess.run(f"seq {jobs} | xargs -P8 -n1 {HANDLER}", shell=True, check=True)
    return jobs / (time.perf_counter() - began)


def child(args: argparse.Namespace) -> None:
    loop = Loop(args.child, args.work_us / 1e6, args.side_us / 1e6, args.forkserver)
    loop.run(200)  # warm up
    loop.calls.clear()
    loop.done = 0
    loop.stop.clear()
    rate = loop.run(args.jobs)
    calls = sorted(loop.calls)
    n = len(calls)
    print(json.dumps({"rate": rate, "p50": calls[n // 2] * 1e6, "p90": calls[n * 9 // 10] * 1e6}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work-us", type=float, default=100.0)
    parser.add_argument("--side-us", type=float, default=0.0)
    modes = "vfork (first: the rest against it), clone, forkserver, sync, thread"
    parser.add_argument("--modes", default="vfork,forkserver", help=modes)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--forkserver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="jobd-loop-model-") as tmp:
        forkserver = build_forkserver(Path(tmp))
        modes = args.modes.split(",")
        if not forkserver and {"forkserver", "sync"} & set(modes):
            print("no C compiler found (or it could not build the fork server): left out")
            modes = [m for m in modes if m not in ("forkserver", "sync")]
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        work, side = f"{args.work_us:.0f}", f"{args.side_us:.0f}"
        print(f"{args.jobs} jobs a round, concurrency 8, loop work {work}+{work} us a job, "
              f"other threads {side} us a job")  # fmt: skip
        for n in range(args.rounds):
            base = [xargs_rate(args.jobs)]
            results = {}
            order = modes if n % 2 == 0 else modes[::-1]
            for mode in order:
                cmd = [sys.executable, __file__, "--child", mode, "--jobs", str(args.jobs),
                       "--work-us", str(args.work_us), "--side-us", str(args.side_us),
                       "--forkserver", str(forkserver or "")]  # fmt: skip
                results[mode] = measure(cmd)
            base.append(xargs_rate(args.jobs))
            xargs = statistics.mean(base)
            line = [f"round {n + 1}: xargs {xargs:5.0f}/s"]
            for mode in modes:
                got, machine = results[mode]
                ratios[mode].append(got["rate"] / xargs)
                line.append(
                    f"{mode} {got['rate']:5.0f}/s ({got['rate'] / xargs:.2f}; start call p50 "
                    f"{got['p50']:.0f} us, p90 {got['p90']:.0f} us; machine {machine:.0%} busy)"
                )
            print("  ".join(line))
        for mode in modes:
            r = ratios[mode]
            print(f"{mode}: median ratio to xargs {statistics.median(r):.2f} "
                  f"({min(r):.2f}-{max(r):.2f})")  # fmt: skip
        for mode in modes[1:]:
            per_round = [f / v for v, f in zip(ratios["vfork"], ratios[mode], strict=True)]
            print(f"{mode}/vfork, median of the rounds: {statistics.median(per_round):.3f}")


if __name__ == "__main__":
    main()
