"""The command line's exit-code contract: one table for every command (``COMMON``), what each
command adds to it or says more precisely (``SPECIFIC``). Shown at the end of each command's
``--help`` (``epilog``) and in docs/reference/exit-codes.md (``markdown``), both from here."""

from __future__ import annotations

import textwrap

from jobd import exitcodes as ex

Meanings = tuple[tuple[int, str], ...]

COMMON: Meanings = (
    (ex.OK, "ok"),
    (ex.FAILURE, "failure: the command ran and did not do what was asked"),
    (ex.USAGE, "usage: a bad command line (an unknown queue or option, a bad value)"),
    (ex.NOT_FOUND, "not found: the job or record named is not there"),
    (ex.UNAVAILABLE, "Redis unavailable (EX_UNAVAILABLE): it cannot be reached"),
    (ex.CONFIG, "config invalid (EX_CONFIG): the config file is unreadable or invalid"),
)

SPECIFIC: dict[str, Meanings] = {
    "validate": ((ex.CONFIG, "the config is not valid (every problem is printed)"),),
    "run": (
        (ex.OK, "stopped by SIGTERM or SIGINT, every job handed back or finished"),
        (ex.FAILURE, "with processes over 1: a daemon ended uncleanly"),
        (ex.UNAVAILABLE, "Redis could not be reached at start"),
    ),
    "enqueue": (
        (
            ex.FAILURE,
            "--lines/--ndjson: the input could not be read or the job ids not "
            "written (stdout a closed pipe; stderr names the lines not sent)",
        ),
        (ex.DUPLICATE, "--unique and the job id is already there (one job)"),
        (
            ex.DATAERR,
            "(EX_DATAERR) --lines/--ndjson: some line was refused (each is named on "
            "stderr as FILE:LINE: why; the others are enqueued)",
        ),
        (ex.UNAVAILABLE, "Redis cannot be reached, or could not take some lines now"),
        (ex.TEMPFAIL, "(EX_TEMPFAIL) --wait-*: enqueued, but not confirmed durable"),
        (ex.OK, "--wait: the job is done (its result, if any, is on stdout)"),
        (
            ex.OK,
            "--wait: the queue's dedupe window acknowledged the job unrun, its job id done "
            "within it (the earlier run's result, if kept, is on stdout)",
        ),
        (ex.JOB_DEAD, "--wait: the job failed for good: dead-lettered (or poison, malformed)"),
        (ex.JOB_CANCELLED, "--wait: the job was cancelled (jobd cancel)"),
        (ex.JOB_EXPIRED, "--wait: the job expired unrun (jobd_expires_at, max_wait)"),
        (
            ex.WAIT_TIMEOUT,
            "--wait --wait-timeout: the job had not ended by then (it goes on; "
            "`jobd job` tells how it ends)",
        ),
        (ex.UNAVAILABLE, "--wait: Redis stayed away for more than a minute during the wait"),
        (ex.FAILURE, "--wait: Redis answered a read of the job's end or result with an error"),
    ),
    "dashboard": ((ex.UNAVAILABLE, "also: cannot listen on HOST:PORT"),),
    "status": ((ex.OK, "--watch too, ended by SIGINT or SIGTERM"),),
    "dlq": (
        (
            ex.FAILURE,
            "requeue: a record was left in place (it holds no job jobd can run); "
            "purge: not confirmed at the prompt",
        ),
        (ex.USAGE, "purge: stdin is not a terminal and --yes was not given"),
        (ex.NOT_FOUND, "show, requeue: no such record (requeue then moves nothing)"),
    ),
    "cancel": (
        (ex.NOT_FOUND, "no job of the ids was found running, waiting or delayed"),
        (
            ex.UNCONFIRMED,
            "--wait: every job found running is settled, but one by another "
            "daemon than the one that ran it (its handler's end cannot be seen from Redis)",
        ),
        (
            ex.TEMPFAIL,
            "(EX_TEMPFAIL) --wait DURATION: a job found running had not stopped by "
            "then; or interrupted (the cancellations hold)",
        ),
    ),
    "job": ((ex.NOT_FOUND, "its state is unknown: no record of it"),),
    "notify": (
        (ex.OK, "jobd has read the message"),
        (
            ex.FAILURE,
            "NOTIFY_SOCKET is not set, the message could not be sent, or jobd did not read it "
            "within 5s",
        ),
        (
            ex.USAGE,
            "nothing to say, a bad --progress or --extend, a newline in a value, a message jobd "
            "would not take whole (over 64 KiB or 64 lines: a large result goes in $JOBD_RESULT)",
        ),
    ),
    "events": (
        (ex.OK, "a --follow too, ended by SIGINT or SIGTERM"),
        (
            ex.UNAVAILABLE,
            "a --follow waits for Redis instead, and goes on after the last event shown",
        ),
    ),
}


def table(command: str | None) -> list[tuple[int, str, list[str]]]:
    """Each code ``command`` exits with: its common meaning ('' for a code only it uses) and
    what it means there, in code order."""
    specific = SPECIFIC.get(command or "", ())
    codes = sorted({code for code, _ in COMMON} | {code for code, _ in specific})
    common = dict(COMMON)
    return [(c, common.get(c, ""), [what for code, what in specific if code == c]) for c in codes]


def epilog(command: str | None, before: str = "") -> str:
    """The end of ``command``'s --help: ``before`` (its own notes), then its exit codes, each
    code's common meaning and, below it, the command's own."""
    lines = ["exit status (docs/reference/exit-codes.md):"]
    for code, meaning, own in table(command):
        texts = ([meaning] if meaning else []) + [f"{command}: {what}" for what in own]
        for i, text in enumerate(texts):
            first = f"  {code:>3}  " if i == 0 else " " * 7
            lines += textwrap.wrap(text, 79, initial_indent=first, subsequent_indent=" " * 9)
    return (before.rstrip("\n") + "\n\n" if before else "") + "\n".join(lines) + "\n"


def markdown() -> str:
    """docs/reference/exit-codes.md: the common table, then each command's own meanings."""
    out = [
        "# Exit codes",
        "",
        "<!-- Generated by `python -m jobd.cli.exits` from jobd/cli/exits.py: edit that. -->",
        "",
        "Every `jobd` command exits with one of these codes; `jobd COMMAND --help` ends with "
        "the same table and that command's own meanings. A reader of its output that goes "
        "away (`jobd dlq q list | head -1`) changes no command's code but `jobd enqueue`'s "
        "(its job ids are its work): what is written after it went is dropped, and the "
        "command goes on to its end (`jobd job` and `jobd events`, `--follow` too, end there).",
        "",
        "| Code | Meaning |",
        "|-----:|---------|",
        *[f"| {code} | {meaning} |" for code, meaning in COMMON],
        "",
        "## Per command",
        "",
    ]
    for command, meanings in SPECIFIC.items():
        out.append(f"### jobd {command}")
        out.append("")
        out += [f"- **{code}**: {what}" for code, what in meanings]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    sys.stdout.write(markdown())
