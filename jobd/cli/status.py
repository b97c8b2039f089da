"""How `jobd status` prints a report (``store.status`` reads it)."""

from __future__ import annotations

import datetime
from typing import Any

from jobd.logs import printable


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render(report: dict[str, Any]) -> str:
    lines = [f"jobd status on {report['redis']}"]
    for name, s in report["queues"].items():
        lines.append(f"queue {name}  (stream {s['stream']}, group {s['group']})")
        if not s["exists"]:
            lines.append("  no consumer group yet: no daemon has run this queue")
        if s.get("paused"):
            p = s["paused"]
            lines.append(f"  PAUSED since {_when(p['since'])} by {p['by']}: "
                         "no new job starts until `jobd resume`")  # fmt: skip
        last, this = s["last_minute"], s["this_minute"]
        lines += [
            f"  length {s['length']}  lag {s['lag'] if s['lag'] is not None else '-'}  "
            f"pending {s['pending']} (oldest {_age(s['oldest_pending_age'])})  "
            f"delayed {s['delayed']}  dead-lettered {s['dead_lettered']}",
            f"  last minute: done {last['done']}, failed {last['failed']} "
            f"(retried {last['retried']}, dead {last['dead']});  "
            f"this minute: done {this['done']}, failed {this['failed']}",
        ]
        if this["deduped"] or last["deduped"]:
            lines.append(f"  deduped: last minute {last['deduped']}, this minute {this['deduped']}")
        lines += _consumers(s["consumers"])
        for level, b in s.get("levels", {}).items():
            lag = b["lag"] if b["lag"] is not None else "-"
            lines.append(
                f"  level {level}: length {b['length']}  lag {lag}  pending {b['pending']}  "
                f"delayed {b['delayed']}  (stream {b['stream']})"
            )
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
        for p in s["schedule"]:
            at = datetime.datetime.fromtimestamp(p["next_tick"], datetime.UTC)
            lines.append(
                f"  schedule {p['name']}  {p['cron']!r} ({p['timezone']})  "
                f"next tick {at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
            )
    return "\n".join(printable(line) for line in lines)  # names others wrote: escaped


def _consumers(consumers: list[dict[str, Any]]) -> list[str]:
    """One line per consumer; a host's several daemons (``processes``) under one line for
    the host, in process order."""
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
            f"{indent}consumer {c['name']}  idle {_age(c['idle'])}  holding {c['holding']}"
            for c in group
        ]
    return lines


def _when(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.UTC).isoformat(timespec="seconds")
