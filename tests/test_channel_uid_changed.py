"""Review 34n: the stranger filter (``Channel.speak_as``) knows the uid a queue's ``run_as``
user had when the config was last read (the daemon's start, each reload: ``results.uids``),
while each spawn looks the user up again (``launch.identity``). A user whose uid changes in
between (``usermod -u``, a user deleted and made again: the uid a spawn gets is the new one)
runs handlers the channel calls strangers: every message of theirs dropped (no progress, no
status, no extended deadline, no result) until a reload, with nothing said but a counter.

A real daemon in this process, a real handler (Python with a raw socket) run as the user; the
uid change is the passwd lookup answering the new uid from then on (root only: run_as).

Fixed: each spawn tells the channel the uid it switched to, before the handler is exec'd
(``launch.start``'s ``hear``: ``Channel.speaking``)."""

from __future__ import annotations

import os
import pwd

import pytest
import redis
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop, started

from jobd.outcome import Verb

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handlers of another user: root")

NEW_UID = 64000  # nobody's uid after ``usermod -u 64000 nobody``
SEND = (
    'import os,socket;a=os.environ["NOTIFY_SOCKET"];'
    "socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)"
    '.sendto(b"X_JOBD_RESULT=mine","\\0"+a[1:] if a[0]=="@" else a)'
)


def test_a_handler_of_a_user_whose_uid_changed_since_the_config_was_read_is_heard(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = f"[/usr/bin/python3, -c, '{SEND}']"
    loop = started(r, write_config, opened, command, run_as="{user: nobody}")
    old = pwd.getpwnam("nobody")
    assert loop.daemon.running.channel.uids == {old.pw_uid}
    # The user's uid changes (usermod -u); no reload: the next spawn gets the new one.
    changed = pwd.struct_passwd((old.pw_name, old.pw_passwd, NEW_UID, old.pw_gid,
                                 old.pw_gecos, old.pw_dir, old.pw_shell))  # fmt: skip
    real = pwd.getpwnam
    monkeypatch.setattr(pwd, "getpwnam", lambda name: changed if name == "nobody" else real(name))
    r.xadd(STREAM, {"payload": "x", "job_id": "j1"})
    handler = loop.handler()
    outcome = loop.outcome()
    assert handler.status is not None and handler.status.code == 0, handler.status
    dropped = loop.daemon.running.channel.dropped
    assert (outcome.verb, outcome.result) == (Verb.ACK, b"mine"), (outcome.verb, dropped)
