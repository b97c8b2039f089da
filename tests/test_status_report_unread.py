"""The daemon's STATUS= line to systemd (``daemon.report``): a queue whose group was not read
(``lib/group.lua``: here a stream holding entries and another application's group, not the
queue's) has no lag to add, and the line says so instead of counting it as nothing waiting
(review 36l: "backlog 0"). A group the config does not name beside the queue's leaves its lag
read (issue 36: group names are consumer-role data, read). A real Redis, a real datagram socket
as systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import socket
from pathlib import Path

import redis
from support import queue_config

from jobd.config import load
from jobd.daemon.notify import Notifier
from jobd.daemon.report import LoopView, StatusReport
from jobd.web.metrics import Metrics


def said(r: redis.Redis, config: Path, tmp_path: Path) -> bytes:
    q = load(str(config)).queues["q"]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify"))
    with listener:
        view = LoopView(queues=(q,), running=0, slots=1, live=True)
        notifier = Notifier(str(tmp_path / "notify"))
        StatusReport(r, Metrics(), notifier, lambda: view, False).tick()
        if notifier._sock is not None:  # its socket, made at its first send
            notifier._sock.close()
        listener.settimeout(5)
        return listener.recv(4096)


def test_a_queue_whose_lag_was_not_read_is_said_not_counted_as_zero(
    r: redis.Redis, write_config, tmp_path: Path
) -> None:
    config = write_config(queue_config("[/bin/true]"))
    for i in range(3):
        r.xadd("jobd:q", {"payload": str(i)})
    r.xgroup_create("jobd:q", "someone-else", id="0")  # not the config's; the queue's not made
    line = said(r, config, tmp_path)
    assert b"backlog unknown (1 queue(s) not read, 0 waiting in the rest)" in line, line


def test_a_queue_read_adds_its_lag(r: redis.Redis, write_config, tmp_path: Path) -> None:
    config = write_config(queue_config("[/bin/true]"))
    for i in range(3):
        r.xadd("jobd:q", {"payload": str(i)})
    r.xgroup_create("jobd:q", "jobd", id="0")
    r.xgroup_create("jobd:q", "someone-else", id="0")  # not the config's: read all the same
    line = said(r, config, tmp_path)
    assert b"backlog 3" in line and b"not read" not in line, line
