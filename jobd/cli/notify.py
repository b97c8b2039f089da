"""``jobd notify``: a handler tells jobd about its job, one message on ``$NOTIFY_SOCKET`` (the
sd_notify format: docs/handlers-talking-back.md), and returns once jobd has read it.

How it knows: the message carries one end of a pipe (SCM_RIGHTS) and jobd closes every
descriptor it receives once it has read the message; end of file on the other end says so. A
process that exits as soon as it has sent could be gone before jobd reads its message, and jobd
takes a message only from a process of the job (``daemon.channel``): waiting keeps it there.
``systemd-notify`` (from systemd 246) does the same with ``BARRIER=1``; it also names its
parent, the handler, as the sender.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import sys
import time

from jobd import exitcodes

READ_WITHIN = 5.0  # seconds jobd has to read the message (sd_notify_barrier's default)
# What the daemon takes of one message, said again here (its modules are not imported: `jobd
# notify` runs in a handler's loops, and starts fast; tests/test_notify_cli.py holds them
# equal): its bytes (daemon.receive.MESSAGE_MAX: more is cut, and dropped as truncated), its
# lines (process.channel.LINES_MAX: more is refused whole), EXTEND_TIMEOUT_USEC at most
# (process.channel.USEC_MAX: more is malformed).
MESSAGE_MAX = 65536
LINES_MAX = 64
USEC_MAX = 2**64 - 1


def message(args: argparse.Namespace) -> bytes:
    """The message the arguments ask for; ValueError when one cannot be said."""
    fields: list[tuple[str, str]] = []
    if args.status is not None:
        fields.append(("STATUS", args.status))
    if args.progress is not None:
        value = float(args.progress)  # ValueError: not a number
        if not 0 <= value <= 100:
            raise ValueError(f"--progress {args.progress}: a percentage is from 0 to 100")
        fields.append(("X_JOBD_PROGRESS", decimal(value)))
    if args.extend is not None:
        fields.append(("EXTEND_TIMEOUT_USEC", str(microseconds(args.extend))))
    if args.watchdog:
        fields.append(("WATCHDOG", "1"))
    if args.result is not None:
        fields.append(("X_JOBD_RESULT", args.result))
    for pair in args.fields:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{pair!r} is not KEY=VALUE")
        fields.append((key, value))
    if not fields:
        raise ValueError("nothing to say: give --status, --progress, --extend, --watchdog, "
                         "--result or KEY=VALUE")  # fmt: skip
    for key, value in fields:
        if "\n" in key or "\n" in value or "=" in key:
            raise ValueError(f"{key}: no newline in a key or a value, no '=' in a key")
    if len(fields) > LINES_MAX:
        raise ValueError(f"{len(fields)} fields: jobd takes {LINES_MAX} in one message at most")
    data = "\n".join(f"{k}={v}" for k, v in fields).encode("utf-8", "surrogateescape")
    if len(data) > MESSAGE_MAX:
        raise ValueError(
            f"the message is {len(data)} bytes, more than the {MESSAGE_MAX} jobd reads of one"
            " (write a result this large to the file $JOBD_RESULT names)"
        )
    return data


def decimal(value: float) -> str:
    """``value`` as a plain decimal (``5e-05`` is ``0.00005``, ``100.0`` is ``100``): the
    daemon takes no exponent. Exact: it reads back as the same float."""
    from decimal import Decimal

    return format(Decimal(repr(abs(value))).normalize(), "f")  # abs: -0.0 is 0


def microseconds(duration: str) -> int:
    """``duration`` in µs for EXTEND_TIMEOUT_USEC, at most USEC_MAX (584 542 years: past any
    max_timeout, so a longer one asks for as long as max_timeout allows, as it meant);
    ValueError when it is no duration."""
    from jobd.config import durations

    return round(min(durations.parse(duration) * 1e6, USEC_MAX))


def address(name: str) -> str | bytes:
    """NOTIFY_SOCKET as a socket address: a leading ``@`` is the abstract namespace."""
    return b"\0" + os.fsencode(name[1:]) if name.startswith("@") else name


def send(args: argparse.Namespace) -> int:
    """Send the message; 0 once jobd has read it, 1 when it could not be sent or was not read
    within READ_WITHIN, 2 for a bad command line."""
    try:
        data = message(args)
    except ValueError as exc:
        print(f"jobd notify: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    target = os.environ.get("NOTIFY_SOCKET")
    if not target:
        print("jobd notify: NOTIFY_SOCKET is not set (not run by jobd?)", file=sys.stderr)
        return exitcodes.FAILURE
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    deadline = time.monotonic() + READ_WITHIN  # for the send and the read: a full channel's
    try:  # queue blocks the send as long as its reader does not read
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(READ_WITHIN)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, write_end.to_bytes(4, sys.byteorder))]
            try:
                sock.sendmsg([data], rights, 0, address(target))
            except TimeoutError:
                print(f"jobd notify: not read within {READ_WITHIN:g}s (its queue is full)",
                      file=sys.stderr)  # fmt: skip
                return exitcodes.FAILURE
        os.close(write_end)
        write_end = -1
        if not select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))[0]:
            print(f"jobd notify: not read within {READ_WITHIN:g}s", file=sys.stderr)
            return exitcodes.FAILURE
    except OSError as exc:
        print(f"jobd notify: cannot send to {target}: {exc.strerror or exc}", file=sys.stderr)
        return exitcodes.FAILURE
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    return exitcodes.OK


def add_arguments(commands: argparse._SubParsersAction) -> None:
    notify = commands.add_parser(
        "notify",
        help="from a handler: tell jobd its status, progress, more time, liveness or result",
        description="Send one message to $NOTIFY_SOCKET (sd_notify format) and wait until jobd "
        "has read it. Needs no config and no Redis.",
    )
    notify.add_argument("--status", metavar="TEXT", help="the job's status line (STATUS=)")
    notify.add_argument("--progress", metavar="N", help="percent done, 0 to 100 (X_JOBD_PROGRESS=)")
    notify.add_argument(
        "--extend",
        metavar="DURATION",
        help="deadline: now + DURATION, up to max_timeout (EXTEND_TIMEOUT_USEC=)",
    )
    notify.add_argument("--watchdog", action="store_true", help="still alive (WATCHDOG=1)")
    notify.add_argument(
        "--result",
        metavar="TEXT",
        help="the job's result, one line, the message at most 64 KiB (X_JOBD_RESULT=; more: "
        "write it to the file $JOBD_RESULT names)",
    )
    notify.add_argument("fields", nargs="*", metavar="KEY=VALUE", help="any other field, as is")
