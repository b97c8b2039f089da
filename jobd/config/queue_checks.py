"""What a schema cannot say about one queue: its command given, durations above zero, lease
timing, the history's tail size, backoff, its dead-letter stream, the program on disk, the Unix
user, schedules, priorities and the working directory.

Each check reads the queue through ``QueueSettings`` and is skipped when a value it needs did
not pass the schema (``Unchecked``), so every other check of the queue still runs.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
from collections.abc import Callable
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from jobd.config import durations, sizes
from jobd.config.problems import Problem
from jobd.config.queue_settings import QueueSettings
from jobd.config.view import run_checks

# A lease must survive this many missed renewals before another consumer may take the job.
RENEWALS_PER_RECLAIM = 3
OUTPUT_MAX = 16384  # history.output: bytes of a tail a record keeps, at most
RESULT_MAX = 2**20  # result_max at most: a result is kept whole in the history (store.notes)
# max_follow_ups_bytes from, to: what a job's follow-ups hold is written in one Redis call
FOLLOW_UPS_BYTES = (1024, 64 * 2**20)

Check = Callable[[QueueSettings], list[Problem]]


def queue_problems(q: QueueSettings) -> list[Problem]:
    """Every problem of queue ``q`` that the schema cannot see."""
    return run_checks(CHECKS, q)


def _command_given(q: QueueSettings) -> list[Problem]:
    if q.has("command"):
        return []
    q.view.require(("defaults", "command"))  # defaults that are no mapping may have held it
    return [q.problem((), "'command' is required; set it here or in defaults")]


def _positive(*sub: str) -> Check:
    def check(q: QueueSettings) -> list[Problem]:
        seconds = q.optional_duration(*sub)
        if seconds is not None and seconds <= 0:
            return [q.problem(sub, "must be longer than zero")]
        return []

    return check


def _positive_rate(q: QueueSettings) -> list[Problem]:
    rate = q.rate()
    if rate is not None and rate.per <= 0:
        return [q.problem(("limits", "rate"), "must be longer than zero")]
    return []


def _lease(q: QueueSettings) -> list[Problem]:
    renew, reclaim = q.duration("lease", "renew_every"), q.duration("lease", "reclaim_after")
    if renew * RENEWALS_PER_RECLAIM <= reclaim + 1e-9:
        return []
    limit = durations.format(reclaim / RENEWALS_PER_RECLAIM)
    message = (
        f"{durations.format(renew)} is not well below lease.reclaim_after "
        f"({durations.format(reclaim)}): a lease must survive {RENEWALS_PER_RECLAIM - 1} "
        f"missed renewals; set renew_every to {limit} or less"
    )
    return [q.problem(("lease", "renew_every"), message)]


def _history_output(q: QueueSettings) -> list[Problem]:
    if sizes.parse(q.get("history", "output")) > OUTPUT_MAX:
        return [q.problem(("history", "output"), "is more than 16KiB; keep a shorter tail")]
    return []


def _result_max(q: QueueSettings) -> list[Problem]:
    if sizes.parse(q.get("result_max")) > RESULT_MAX:
        return [q.problem(("result_max",), "is more than 1MiB; a result is kept whole in the "
                          "job's history: pass larger data by reference")]  # fmt: skip
    return []


def _follow_ups_bytes(q: QueueSettings) -> list[Problem]:
    least, most = FOLLOW_UPS_BYTES
    if least <= sizes.parse(q.get("max_follow_ups_bytes")) <= most:
        return []
    why = "give from 1KiB to 64MiB: a job's follow-ups are written in one Redis call"
    return [q.problem(("max_follow_ups_bytes",), why)]


def _backoff(q: QueueSettings) -> list[Problem]:
    if q.duration("retry", "max_backoff") < q.duration("retry", "backoff"):
        return [q.problem(("retry", "max_backoff"), "is shorter than retry.backoff; raise it")]
    return []


def _dead_letter_not_own_stream(q: QueueSettings) -> list[Problem]:
    stream = q.stream()
    if q.keys().dead_letter != stream:
        return []
    message = (
        f"the dead-letter stream is the queue's own stream {stream!r}; "
        "dead letters would run again: name another stream"
    )
    return [q.problem(("dead_letter", "stream"), message)]


def _command(q: QueueSettings) -> list[Problem]:
    if not q.has("command"):
        return []
    program = q.command()[0]
    if "/" in program:
        return _program_file(q, program)
    path = q.env().get("PATH")
    if shutil.which(program, path=path) is None:
        # The PATH jobd gives is shown; the queue's own env.PATH is not: env values may be secrets.
        given = "the queue's env.PATH" if "PATH" in q.get("env", default={}) else path
        message = (
            f"{program!r} is not found on the handler's PATH ({given}); "
            "give its full path, or set env.PATH"
        )
        return [q.problem(("command", 0), message)]
    return []


def _program_file(q: QueueSettings, program: str) -> list[Problem]:
    if not os.path.exists(program):
        return [q.problem(("command", 0), f"{program!r} does not exist")]
    if os.path.isdir(program):
        return [q.problem(("command", 0), f"{program!r} is a directory")]
    if not os.access(program, os.X_OK):
        message = (
            f"{program!r} is not executable; run chmod +x on it, or name its "
            "interpreter first, e.g. [python3, script.py]"
        )
        return [q.problem(("command", 0), message)]
    return []


def _run_as(q: QueueSettings) -> list[Problem]:
    user = q.get("run_as", "user", default=None)
    group = q.get("run_as", "group", default=None)
    problems = []
    if group and not user:
        message = (
            "a group alone would leave handlers running as root, with every capability; "
            "name the user they run as too, e.g. run_as: {user: jobs, group: media}"
        )
        problems.append(q.problem(("run_as",), message))
    if (user or group) and os.geteuid() != 0:
        problems.append(q.problem(("run_as",), "switching user or group needs jobd to run as root"))
    for kind, name, find in (("user", user, pwd.getpwnam), ("group", group, grp.getgrnam)):
        if name is None:
            continue
        try:
            find(name)
        except KeyError:
            problems.append(q.problem(("run_as", kind), f"no {kind} {name!r} on this host"))
    return problems


def _prlimit(q: QueueSettings) -> list[Problem]:
    if q.resources().prlimit_args() and shutil.which("prlimit") is None:
        return [
            q.problem(
                ("resources",),
                "address_space, open_files and cpu_time need "
                "prlimit(1) on PATH: install util-linux, or remove them",
            )
        ]
    return []


def _schedule(q: QueueSettings) -> list[Problem]:
    schedules = q.schedule()
    if not schedules:
        return []  # croniter, never imported: most configs have no schedule
    # Imported at the first check, not with jobd.config: croniter runs `file` at import
    # (platform.architecture), and a child forked at jobd's own import came before jobd made
    # itself non-dumpable (cli.main): a copy of it, environment and all, readable until its exec.
    from croniter import croniter

    problems = []
    names: set[str] = set()
    for i, s in enumerate(schedules):
        if not croniter.is_valid(s.cron):
            message = (
                f"{s.cron!r} is not a cron expression: write five fields (minute hour day "
                "month weekday), or six with seconds last, e.g. '*/5 * * * *'"
            )
            problems.append(q.problem(("schedule", i, "cron"), message))
        try:
            ZoneInfo(s.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            message = (
                f"no time zone {s.timezone!r}; write an IANA name such as UTC or Europe/Berlin"
            )
            problems.append(q.problem(("schedule", i, "timezone"), message))
        if s.name in names:
            message = (
                f"a second schedule named {s.name!r} (same name, or the same cron, time zone "
                "and payload): each tick would be enqueued once for both; give it a name"
            )
            problems.append(q.problem(("schedule", i), message))
        names.add(s.name)
        if s.catch_up <= 0:
            problems.append(q.problem(("schedule", i, "catch_up"), "must be longer than zero"))
    return problems


def _default_priority(q: QueueSettings) -> list[Problem]:
    names, default = q.priorities()
    if not names or not default or default in names:  # empty: the last level
        return []
    message = f"{default!r} is not one of the queue's priorities ({', '.join(names)})"
    return [q.problem(("default_priority",), message)]


def _max_timeout(q: QueueSettings) -> list[Problem]:
    most = q.optional_duration("max_timeout")
    if most is None or most >= q.duration("timeout"):
        return []
    return [q.problem(("max_timeout",), "must be at least timeout (a handler cannot be given "
                      "less time by asking for more)")]  # fmt: skip


def _cwd(q: QueueSettings) -> list[Problem]:
    cwd = q.cwd()
    if os.path.isdir(cwd):
        return []
    return [q.problem(("cwd",), f"{cwd!r} is not an existing directory")]


# In this order: problems at one position are listed as they come.
CHECKS: tuple[Check, ...] = (
    _command_given,
    _positive("timeout"),
    _positive("lease", "renew_every"),
    _positive("lease", "reclaim_after"),
    _positive("dedupe", "window"),
    _positive_rate,
    _positive("starvation_after"),
    _positive("max_wait"),
    _positive("watchdog"),
    _max_timeout,
    _positive("history", "max_age"),
    _history_output,
    _follow_ups_bytes,
    _result_max,
    _lease,
    _backoff,
    _dead_letter_not_own_stream,
    _command,
    _run_as,
    _prlimit,
    _schedule,
    _default_priority,
    _cwd,
)
