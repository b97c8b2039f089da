"""One job as a line of JSON: the ``--ndjson`` format of `jobd enqueue`, which the lines a
handler writes into the file ``JOBD_ENQUEUE`` names share (``process.followups``).

Each line is a JSON object (``NDJSON_KEYS``): ``payload`` (a string, sent as its UTF-8 bytes;
any other JSON value is sent as compact JSON) or ``payload_b64`` (base64, for binary);
``job_id``; ``fields`` (an object of string values); ``delay``, ``timeout``, ``expires_in`` (a
duration: "30s", or seconds); ``at``, ``expires_at`` (ISO 8601 or Unix seconds); ``unique``
(true/false); ``max_attempts``; ``traceparent``, ``tracestate``, ``baggage`` (W3C trace
context, ``jobd.trace``). A key on a line overrides the template's of the same kind (``delay``
or ``at`` both of them; a trace key all three).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import difflib
from collections.abc import Callable

import orjson

from jobd import trace
from jobd.config import durations
from jobd.newjob import NewJob, parse_time


# --ndjson: each key of a line, and what reads its value (a ValueError says what is wrong).
def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}: give a non-empty string")
    return value


def _fields(key: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{key}: give an object of string values")
    return value


def _duration(key: str, value: object) -> float:
    if not isinstance(value, str | int | float):
        raise ValueError(f"{key}: give a duration (30s, 5m) or seconds")
    try:
        return durations.parse(value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def _time(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{key}: give ISO 8601 or Unix seconds")
    return parse_time(str(value), key)


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: give true or false")
    return value


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key}: give a whole number")
    return value


READERS: dict[str, Callable[[str, object], object]] = {
    "job_id": _text, "fields": _fields, "delay": _duration, "at": _time, "unique": _flag,
    "timeout": _duration, "max_attempts": _count, "expires_in": _duration, "expires_at": _time,
    **dict.fromkeys(trace.KEYS, trace.ndjson_value),
}  # fmt: skip
PAYLOAD_KEYS = ("payload", "payload_b64")
NDJSON_KEYS = (*PAYLOAD_KEYS, *READERS)
EITHER = {"delay": "at", "at": "delay", "expires_in": "expires_at", "expires_at": "expires_in"}
_NAMES = tuple(f.name for f in dataclasses.fields(NewJob))


def job_from_json(body: bytes, template: NewJob) -> NewJob:
    """The job of one --ndjson line: ``template`` with what the line says; ValueError."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return job_from_object(obj, as_arguments(template))


def as_arguments(template: NewJob) -> dict[str, object]:
    """``template``'s attributes, as ``job_from_object`` starts from them: made once for many
    lines (``dataclasses.replace`` makes them again for each: most of a line's cost)."""
    return {name: getattr(template, name) for name in _NAMES}


def job_from_object(obj: dict[str, object], template: dict[str, object]) -> NewJob:
    """The job of one --ndjson line, parsed (a JSON object): ``template`` (``as_arguments``)
    with what the line says; ValueError."""
    changes: dict[str, object] = {"payload": _payload(obj)}
    for key, value in obj.items():
        if key in PAYLOAD_KEYS:
            continue
        read = READERS.get(key)
        if read is None:
            close = difflib.get_close_matches(key, NDJSON_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown key {key!r}{hint}; keys: {', '.join(NDJSON_KEYS)}")
        changes[key] = read(key, value)
        other = EITHER.get(key)
        if other is not None and other not in obj:
            changes[other] = None  # the line's key replaces the flag of the same kind
    changes.update(trace.whole(obj))  # a line's trace context replaces the flags' whole
    return NewJob(**{**template, **changes})  # type: ignore[arg-type]


def _payload(obj: dict[str, object]) -> bytes:
    """The payload a line gives: ``payload`` or ``payload_b64``, exactly one of them."""
    if ("payload" in obj) == ("payload_b64" in obj):
        raise ValueError("give payload (a string or any JSON) or payload_b64 (base64), once")
    if "payload_b64" in obj:
        try:
            return base64.b64decode(_text("payload_b64", obj["payload_b64"]), validate=True)
        except binascii.Error:
            raise ValueError("payload_b64: not base64") from None
    payload = obj["payload"]
    return payload.encode() if isinstance(payload, str) else orjson.dumps(payload)
