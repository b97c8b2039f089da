"""How `jobd status` prints a report (``store.status`` reads it)."""

from __future__ import annotations

import datetime
from collections import Counter
from typing import TYPE_CHECKING, Any

from jobd.logs import printable
from jobd.store import status

if TYPE_CHECKING:
    from jobd.config import Config
    from jobd.store.store import Store


def with_running(store: Store, config: Config, report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with each queue's running jobs (``running``: as ``jobd job --json`` shows
    them, progress and status included where their handlers told them), oldest first, of the
    active records one bounded read takes (``running_unread``: those it did not, if any)."""
    from jobd.cli.history import running_json

    for name, queue in config.queues.items():
        found = store.running_read(queue)
        report["queues"][name]["running"] = [running_json(r) for r in found.jobs]
        if not found.complete:  # more active records than one read takes (100 000, or garbage)
            report["queues"][name]["running_unread"] = found.records - found.read
    return report


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render(report: dict[str, Any]) -> str:
    lines = [f"jobd status on {report['redis']}", *_daemons(report)]
    for name, s in report["queues"].items():
        lines.append(f"queue {name}  (stream {s['stream']}, group {s['group']})")
        if not s["exists"]:
            lines.append("  no consumer group yet: no daemon has run this queue")
        if s.get("paused"):
            p = s["paused"]
            lines.append(f"  PAUSED since {_when(p['since'])} by {p['by']}: "
                         "no new job starts until `jobd resume`")  # fmt: skip
        last, this = s["last_minute"], s["this_minute"]
        q = {**s, **status.over_levels(s)} if s.get("levels") else s  # over its levels
        lines += [
            f"  length {q['length']}  lag {_lag(q)}  "
            f"pending {_count(q['pending'])} (oldest {_age(q['oldest_pending_age'])})  "
            f"delayed {_count(q['delayed'])}  dead-lettered {_count(s['dead_lettered'])}",
            f"  last minute: done {last['done']}, failed {last['failed']} "
            f"(retried {last['retried']}, dead {last['dead']});  "
            f"this minute: done {this['done']}, failed {this['failed']}",
        ]
        if this["deduped"] or last["deduped"]:
            lines.append(f"  deduped: last minute {last['deduped']}, this minute {this['deduped']}")
        lines += _consumers(s)
        lines += _serving(s)
        lines += _levels(s)
        limits = s["limits"]
        if "slots" in limits:
            lines.append(f"  slots {limits['slots']['used']}/{limits['slots']['limit']} in use")
        if "rate" in limits:
            r = limits["rate"]
            lines.append(
                f"  rate {r['count']} per {r['per']:g}s (burst {r['burst']}): "
                f"{r['tokens']:g} token(s) left"
            )
        for name, w in limits.get("waiting", {}).items():
            what = "a slot" if w["for"] == "slot" else "a rate token"
            lines.append(f"  consumer {name} waiting for {what}")
        lines += [_running(r) for r in s.get("running", [])]
        for p in s["schedule"]:
            at = datetime.datetime.fromtimestamp(p["next_tick"], datetime.UTC)
            lines.append(
                f"  schedule {p['name']}  {p['cron']!r} ({p['timezone']})  "
                f"next tick {at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
            )
    return "\n".join(printable(line) for line in lines)  # names others wrote: escaped


def _daemons(report: dict[str, Any]) -> list[str]:
    """The daemon registry: one line per daemon, and a line per problem found."""
    if "daemons" not in report:
        return []
    daemons = report["daemons"]
    states = ", ".join(f"{n} {state}" for state, n in Counter(d["state"] for d in daemons).items())
    lines = [f"daemons: {len(daemons)}" + (f" ({states})" if states else "")]
    if report.get("daemons_error"):
        lines.append(f"  registry: {report['daemons_error']}")
    for d in daemons:
        state = d["state"].upper() if d["state"] in ("dead", "stale") else d["state"]
        up = "-"
        if d["started"] is not None and d["beat"] is not None:
            up = _age(d["beat"] + d["since_beat"] - d["started"])
        queues = ", ".join(dict.fromkeys(q["name"] for q in d["queues"])) or "-"
        lines.append(
            f"  daemon {d['name']}  {state}  last beat {_age(d['since_beat'])} ago "
            f"(lease {d['lease']:g}s)  host {d['host']} pid {d['pid']}  jobd {d['version']}  "
            f"running {d['running']}/{d['slots']}  up {up}  queues {queues}"
        )
        lines += [f"    problem: {p}" for p in d["problems"]]
    return lines


def _levels(s: dict[str, Any]) -> list[str]:
    """One line per priority level of queue status ``s``: its own figures."""
    return [
        f"  level {level}: length {b['length']}  lag {_lag(b)}  "
        f"pending {_count(b['pending'])} (oldest {_age(b['oldest_pending_age'])})  "
        f"delayed {_count(b['delayed'])}  (stream {b['stream']})"
        for level, b in s.get("levels", {}).items()
    ]


def _serving(s: dict[str, Any]) -> list[str]:
    """The daemons serving a queue (the registry's), read from it yet or not."""
    if "daemons" not in s:
        return []
    serving = ", ".join(f"{d['name']} ({d['state']})" for d in s["daemons"])
    return [f"  daemons serving it: {serving or 'none'}"]


def _consumers(s: dict[str, Any]) -> list[str]:
    """One line per consumer of queue status ``s``; a host's several daemons (``processes``)
    under one line for the host, in process order; a group of too many, its count alone."""
    if not s.get("consumers_listed", True):
        return [f"  consumers: {s['consumers_count']} (not listed: more than 256)"]
    consumers: list[dict[str, Any]] = s["consumers"]
    hosts: dict[str, list[dict[str, Any]]] = {}
    for c in sorted(consumers, key=lambda c: (c["host"] or c["name"], c["process"] or 0)):
        hosts.setdefault(c["host"] or c["name"], []).append(c)
    lines = []
    for host, group in hosts.items():
        indent = "  "
        if len(group) > 1:
            held = sum(c["holding"] for c in group)
            lines.append(f"  host {host}: {len(group)} consumers, holding {held}")
            indent = "    "
        lines += [
            f"{indent}consumer {c['name']}{'…' if c.get('name_cut') else ''}  "
            f"idle {_age(c['idle'])}  holding {c['holding']}"
            for c in group
        ]
    return lines


def _running(r: dict[str, Any]) -> str:
    """One running job: where, and how far it is as its handler told."""
    line = f"  running job {r['job']} on {r['consumer']} (attempt {r['attempt'] or '?'})"
    if r["progress"] is not None:
        line += f"  {r['progress']:g}%"
    return line + (f"  status: {r['status']}" if r["status"] is not None else "")


def _lag(s: dict[str, Any]) -> str:
    """The lag; '-' unknown, "-(≤N)" unknown with at most N waiting (Redis says null: never
    counted by reading entries)."""
    if s["lag"] is None:
        return "-" if s.get("lag_at_most") is None else f"-(≤{s['lag_at_most']})"
    return str(s["lag"])


def _count(n: int | None) -> str:
    """A count, or '-' where Redis answered an error (a key of another type)."""
    return "-" if n is None else str(n)


def _when(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).isoformat(timespec="seconds")
