"""The channel's batch reader (jobd/daemon/receive.py): the C extension and the Python fallback
say the same of every message — its sender's pid, session, cgroup, whether it was alive once
looked up, the flags, the data (cut at MESSAGE_MAX), the descriptors — and the C one reads a
batch a call, parses each message as ``process.channel.parse`` does (held to the same answers
on generated messages) and gives a sender's messages in a row as one, merged as
``Said.merge`` does. Real sockets, real processes; no Redis."""

from __future__ import annotations

import array
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from jobd.daemon import receive
from jobd.process.channel import Said, parse

NATIVE = receive._native


def _pidfds() -> bool:
    """Whether this kernel sends the sender's pidfd with a message (SO_PASSPIDFD, 6.5)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, receive.SO_PASSPIDFD, 1)
        except OSError:
            return False
    return True


PIDFDS = _pidfds()
needs_native = pytest.mark.skipif(NATIVE is None, reason="jobd.daemon._receive is not built")


@pytest.fixture(params=["native", "python"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    if request.param == "native" and NATIVE is None:
        pytest.skip("jobd.daemon._receive is not built")
    if request.param == "python":
        monkeypatch.setattr(receive, "_native", None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.setsockopt(socket.SOL_SOCKET, receive.SO_PASSPIDFD, 1) if PIDFDS else None
    sock.bind(f"\0jobd-test-receive/{os.getpid()}/{request.param}")
    r = receive.Receiver(sock, cgroups=True)
    yield r, sock.getsockname()
    r.close()  # its spare descriptors
    sock.close()


def all_of(r: receive.Receiver, leaders: list[int]) -> list[receive.Message]:
    out: list[receive.Message] = []
    while batch := r.batch(leaders):
        out.extend(batch)
    return out


def test_a_message_with_its_sender_and_descriptors(receiver) -> None:
    r, name = receiver
    read_end, write_end = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        rights = array.array("i", [read_end]).tobytes()
        s.sendmsg([b"STATUS=hello"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, name)
    os.close(read_end)
    ((pid, sid, cgroup, alive, flags, data, fds, *_),) = all_of(r, [os.getsid(0)])
    assert (pid, sid, alive, data, flags & socket.MSG_TRUNC) == (
        os.getpid(), os.getsid(0), True, b"STATUS=hello", 0)  # fmt: skip
    assert cgroup is None, "a leader's session: no cgroup read"
    assert len(fds) == 1 and os.readlink(f"/proc/self/fd/{fds[0]}").startswith("pipe:")
    os.close(fds[0])
    os.close(write_end)


def test_a_stranger_has_its_cgroup_read_and_a_gone_one_is_not_alive(receiver) -> None:
    r, name = receiver
    child = os.fork()
    if child == 0:  # pragma: no cover - sends and is gone before the read
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"X_JOBD_PROGRESS=5", name)
        os._exit(0)
    os.waitpid(child, 0)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"X_JOBD_PROGRESS=6", name)
    (gone, here) = all_of(r, [])
    assert gone[0] == child and gone[5] == b"X_JOBD_PROGRESS=5"
    assert gone[3] is not PIDFDS, "gone before it was looked up: not alive (where pidfds come)"
    assert here[0] == os.getpid() and here[3] is True
    own = Path("/proc/self/cgroup").read_bytes()
    if b"0::" in own:
        assert here[2] == own.split(b"0::", 1)[1].split(b"\n", 1)[0]


def test_a_message_too_long_is_cut_and_flagged(receiver) -> None:
    r, name = receiver
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.sendto(b"x" * (receive.MESSAGE_MAX + 10), name)
        s.sendto(b"after", name)
    cut, after = all_of(r, [os.getsid(0)])
    assert len(cut[5]) == receive.MESSAGE_MAX and cut[4] & socket.MSG_TRUNC
    assert after[5] == b"after" and not after[4] & socket.MSG_TRUNC


def said(message: receive.Message) -> Said:
    """What a message read says: parsed by the extension, or (the fallback) by the caller."""
    return parse(message[5]) if message[7] is None else Said(*message[7])


@needs_native
def test_the_native_reader_takes_a_batch_a_call_a_sender_s_run_as_one(receiver) -> None:
    """8 messages of one sender in a row: one item, what they say merged (the last status,
    the last progress, the result said once, 8 messages of which 2 malformed); then one that
    brings a descriptor stands alone, and so do the messages after it."""
    r, name = receiver
    if receive._native is None:
        pytest.skip("the Python fallback reads one a call")
    read_end, write_end = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        for i in range(8):
            extra = b"\nX_JOBD_RESULT=r" if i == 3 else b"\nnonsense" if i in (2, 5) else b""
            s.sendto(b"STATUS=%d\nX_JOBD_PROGRESS=%d" % (i, 10 * i) + extra, name)
        rights = array.array("i", [read_end]).tobytes()
        s.sendmsg([b"STATUS=fd"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, name)
        s.sendto(b"STATUS=after", name)
    os.close(read_end)
    run, with_fd, after = r.batch([os.getsid(0)])
    merged = Said(well=False, status=b"7", progress=70.0, result=b"r", count=8, bad=2)
    assert said(run) == merged and run[5] == b"STATUS=7\nX_JOBD_PROGRESS=70"
    assert said(with_fd) == Said(status=b"fd") and len(with_fd[6]) == 1
    assert said(after) == Said(status=b"after")
    os.close(with_fd[6][0])
    os.close(write_end)
    assert r.batch([]) == []


def test_a_cut_message_is_not_parsed_nor_merged(receiver) -> None:
    r, name = receiver
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.sendto(b"STATUS=before", name)
        s.sendto(b"STATUS=" + b"x" * receive.MESSAGE_MAX, name)
        s.sendto(b"STATUS=after", name)
    before, cut, after = all_of(r, [os.getsid(0)])
    assert cut[7] is None and cut[4] & socket.MSG_TRUNC
    assert said(before) == Said(status=b"before") and said(after) == Said(status=b"after")


def test_without_room_descriptors_are_dropped_by_the_kernel(receiver) -> None:
    r, name = receiver
    read_end, write_end = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        rights = array.array("i", [read_end]).tobytes()
        s.sendmsg([b"STATUS=x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, name)
    os.close(read_end)
    ((pid, _, _, alive, flags, data, fds, *_),) = r.batch([os.getsid(0)], room=0)
    assert (pid, data, fds) == (os.getpid(), b"STATUS=x", ())
    assert alive is None, "the kernel puts the pidfd after the descriptors: none came"
    # read without room, every message has MSG_CTRUNC (its pidfd cut): it says nothing, left out
    assert not flags & socket.MSG_CTRUNC
    try:
        os.write(write_end, b"x")
        raise AssertionError("the pipe's read end is still open somewhere")
    except BrokenPipeError:
        pass
    finally:
        os.close(write_end)


# Lines made of the keys jobd reads and what their values look like, valid or not: whitespace
# of every kind (what float() and bytes.strip() strip, and what they do not), signs, exponents,
# underscores, dots, digits past 64 bits, bytes that are not UTF-8.
VALUE = st.text(alphabet=" \t\x0b\x0c\r\x1c\x85\xa0.0123456789e+-_naifT1", max_size=30).map(
    lambda t: t.encode("latin-1")
) | st.binary(max_size=40)
KEY = st.sampled_from([b"STATUS", b"X_JOBD_PROGRESS", b"EXTEND_TIMEOUT_USEC", b"WATCHDOG",
                       b"X_JOBD_RESULT", b"READY", b"", b"status"])  # fmt: skip
LINE = st.builds(lambda k, sep, v: k + sep + v, KEY, st.sampled_from([b"=", b"", b"=="]), VALUE)
MESSAGE = st.lists(LINE | st.just(b""), max_size=70).map(b"\n".join) | st.binary(max_size=200)


@needs_native
@settings(max_examples=3000, deadline=None)
@given(MESSAGE)
@example(b"X_JOBD_PROGRESS=" + b"1" * 400)
@example(b"X_JOBD_PROGRESS=0." + b"0" * 400 + b"1")
@example(b"EXTEND_TIMEOUT_USEC=18446744073709551616\nEXTEND_TIMEOUT_USEC=18446744073709551615")
@example(b"X_JOBD_PROGRESS=\x0c42.\x0b\nWATCHDOG=trigger\nWATCHDOG=1 ")
@example(b"\n" * 64 + b"STATUS=x\n\n")
@example(b"STATUS=" + b"s" * 2000 + b"\nX_JOBD_PROGRESS=100.0\nX_JOBD_PROGRESS=100.01")
def test_the_extension_parses_as_process_channel_parse(message: bytes) -> None:
    assert Said(*receive._native_parse(message)) == parse(message)


@needs_native
@settings(max_examples=300, deadline=None)
@given(st.lists(MESSAGE, min_size=1, max_size=8))  # the socket holds 10 (the 11th send blocks)
def test_a_run_read_says_what_its_messages_say_one_after_the_other(messages: list[bytes]) -> None:
    """Sent in a row by one sender and read by the extension: what the items say, taken one
    after the other, is what the messages say, parsed and taken one after the other."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind("")  # an abstract name of the kernel's choosing
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for message in messages:
                s.sendto(message, sock.getsockname())
        r = receive.Receiver(sock, cgroups=False)
        items = all_of(r, [os.getsid(0)])
        r.close()
    assert sum(said(m).count for m in items) == len(messages)
    assert len(items) == 1, "one sender's messages in a row: one item"
    expected = parse(messages[0])
    for message in messages[1:]:
        expected.merge(parse(message))
    assert said(items[0]) == expected


# A sender in a session of its own: its leader (it), or, with "orphan", a child of that leader
# once the leader has exited. It sends "known", then on a line on stdin "unknown", then waits
# for stdin's end: alive while its messages are read.
SENDER = """
import os, socket, sys
if sys.argv[2] == "orphan":
    if os.fork():
        os._exit(0)  # the session's leader gone; the child stays in its session
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
print(os.getpid(), os.getsid(0), flush=True)
sys.stdin.readline()
s.sendto(b"STATUS=known", "\\0" + sys.argv[1])
print(flush=True)
sys.stdin.readline()
s.sendto(b"STATUS=unknown", "\\0" + sys.argv[1])
print(flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("leader_is", ["alive", "orphan"])
def test_a_sender_of_another_session_comes_with_a_pidfd_of_its_leader(
    receiver, leader_is: str
) -> None:
    """Asked (``keep``), a live sender of a session that is no running handler's comes with a
    pidfd of that session's leader (the caller's to close), or NO_LEADER when it has none; one
    of a handler's session with none. The sender runs in a session of its own (the test's own
    session may have its leader outside this pid namespace: getsid says 0 then)."""
    r, name = receiver
    name = (name if isinstance(name, str) else name.decode())[1:]  # abstract: no NUL in argv
    with subprocess.Popen(
        [sys.executable, "-c", SENDER, name, leader_is],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as p:
        assert p.stdin is not None and p.stdout is not None
        pid, sid = map(int, p.stdout.readline().split())
        assert sid != pid if leader_is == "orphan" else sid == pid
        if leader_is == "orphan":
            p.wait(10)  # the leader reaped: no zombie holds the session's id
        p.stdin.write("\n")
        p.stdin.flush()
        p.stdout.readline()
        ((*_, known),) = r.batch([sid], keep=True)
        p.stdin.write("\n")
        p.stdin.flush()
        p.stdout.readline()
        ((*_, leader),) = r.batch([], keep=True)
        fdinfo = Path(f"/proc/self/fdinfo/{leader}").read_text() if leader >= 0 else ""
        p.stdin.close()  # (read while the leader lives: a dead one's pidfd says Pid: -1)
    assert known == -1
    if not PIDFDS:
        assert leader == -1, "no pidfd of the sender: nothing to keep"
        return
    if leader_is == "orphan":
        assert leader == receive.NO_LEADER, "its session's leader is gone"
        return
    assert leader >= 0
    os.close(leader)
    assert f"Pid:\t{sid}\n" in fdinfo, fdinfo
