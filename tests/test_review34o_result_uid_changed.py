"""Review 34o of issue 34: 93bab69 made the channel hear the uid each spawn switched to (a
``run_as`` user whose uid changed since the config was read: ``usermod -u``, a user made
again), but the handler's result file is still judged against the uid its user has when the
handler *ends*: ``results.collected`` takes the file only when it is "a regular file of the
handler's user", that user looked up again at the end (``results.uid``: ``pwd.getpwnam`` of
``run_as.user``), not the uid the handler ran as (looked up by ``launch.identity`` at its
spawn). A handler started before the change, which did its work and wrote its result as the
uid it runs as, fails its attempt with "result file not a regular file of the handler's user"
(a ResultError: dead-lettered) — a job that succeeded. The JOBD_ENQUEUE file of follow-ups is
judged the same way (``process.followups`` through ``results.take``). The same window the
channel's filter had: a spawn's lookup, then a later one that answers otherwise.

Reproduced as tests/test_channel_uid_changed.py does (root: run_as): a daemon in this process,
a real handler run as ``nobody`` (Python) that writes its result to JOBD_RESULT and waits for
SIGUSR1; once the file is there the passwd lookup answers the user's new uid (``usermod -u``),
then the handler is let go and exits 0. It writes a JOBD_ENQUEUE file of one follow-up too;
and the user may be deleted instead (the lookup then raises KeyError).

Fixed (jobd/process/launch.py, handler.py, results.py, followups.py): ``launch.start`` returns
the uid the handler runs as (the daemon's, or its ``run_as`` user's at the spawn), kept as
``Handler.uid``; its result file and its JOBD_ENQUEUE file are judged against that uid, never
a passwd lookup at its end (``results.take``)."""

from __future__ import annotations

import os
import pwd
import signal

import pytest
import redis
from support import wait_group
from test_endings_faults import opened  # noqa: F401  (a fixture)
from test_loop import STREAM, Loop

from jobd.outcome import Verb

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="handlers of another user: root")

NEW_UID = 64000  # nobody's uid after ``usermod -u 64000 nobody``
HANDLER = (
    "import json,os,signal;signal.pthread_sigmask(signal.SIG_BLOCK,{signal.SIGUSR1});"
    'open(os.environ["JOBD_ENQUEUE"],"w").write(json.dumps(dict(queue="f",payload="y")));'
    'open(os.environ["JOBD_RESULT"],"w").write("42");signal.sigwait({signal.SIGUSR1})'
)


@pytest.mark.parametrize("change", ["uid-changed", "user-deleted"])
def test_a_result_written_before_its_users_uid_changed_is_taken(
    r: redis.Redis,
    write_config,
    opened: list[Loop],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    cfg = write_config(
        "redis: {url: '{redis}'}\nshutdown_grace: 200ms\nqueues:\n"
        f"  q: {{stream: {STREAM}, command: [/usr/bin/python3, -c, '{HANDLER}'],"
        " run_as: {user: nobody}}\n"
        "  f: {stream: 'jobd:f', command: [/bin/true]}\n"
    )
    loop = Loop(cfg)
    opened.append(loop)
    wait_group(r, STREAM)
    r.xadd(STREAM, {"payload": "x", "job_id": "j1"})
    handler = loop.handler()
    path = handler.result_path
    assert path is not None
    loop.until(lambda: os.path.exists(path) and os.path.getsize(path) == 2, "its result file")
    old = pwd.getpwnam("nobody")
    assert os.stat(path).st_uid == old.pw_uid  # written as the uid it runs as
    # The user's uid changes (usermod -u), or the user is deleted, while it runs; no reload.
    changed = pwd.struct_passwd((old.pw_name, old.pw_passwd, NEW_UID, old.pw_gid,
                                 old.pw_gecos, old.pw_dir, old.pw_shell))  # fmt: skip
    real = pwd.getpwnam

    def getpwnam(name: str) -> pwd.struct_passwd:
        if name != "nobody":
            return real(name)
        if change == "user-deleted":
            raise KeyError(f"getpwnam(): name not found: {name!r}")
        return changed

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)
    os.kill(handler.pid, signal.SIGUSR1)
    outcome = loop.outcome()
    assert handler.status is not None and handler.status.code == 0, handler.status
    assert (outcome.verb, outcome.error, outcome.result) == (Verb.ACK, None, b"42"), (
        outcome.verb,
        outcome.error,
        handler.result_error,
    )
    assert [f.queue.name for f in outcome.follow_ups] == ["f"], outcome.follow_ups
