"""The config's JSON Schema (``schema.json``): its text, the defaults it declares, which keys
are text, and its verdict on a parsed document, in jobd's words.

The schema is the one home of the config's keys, their types and their defaults; what it
cannot express (lease timing, streams shared between queues, programs on disk) is checked in
``queue_checks``, ``cross_queue`` and ``validation``.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

import jsonschema

from jobd.config.problems import Problem
from jobd.config.redact import NOT_SHOWN, holds_secret
from jobd.config.yamlsrc import Document, Path, kind_of


@cache
def schema() -> dict[str, Any]:
    return json.loads(schema_text())


def schema_text() -> str:
    return resources.files("jobd.config").joinpath("schema.json").read_text("utf-8")


def _defaults_of(node: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, prop in node.get("properties", {}).items():
        if "default" in prop:
            result[key] = prop["default"]
        elif prop.get("type") == "object" and "properties" in prop:
            result[key] = _defaults_of(prop)
    return result


QUEUE_DEFAULTS = _defaults_of(schema()["$defs"]["queue"])
TOP_DEFAULTS = _defaults_of(schema())
SCHEDULE_DEFAULTS = _defaults_of(schema()["$defs"]["queue"]["properties"]["schedule"]["items"])


def is_text(path: Path) -> bool:
    """Whether the value at ``path`` is text (schema type ``string``, or ``x-text``): taken
    exactly as written or as ``${VAR}`` expands, never read as a YAML number, boolean or null."""
    node = _schema_at(path)
    return node is not None and (node.get("type") == "string" or bool(node.get("x-text")))


def _schema_at(path: Path) -> dict[str, Any] | None:
    node: Any = schema()
    for part in path:
        node = _deref(node)
        if isinstance(part, int):
            node = node.get("items")
        else:
            node = node.get("properties", {}).get(part, node.get("additionalProperties"))
        if not isinstance(node, dict):
            return None
    return _deref(node)


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return schema()["$defs"][ref.rsplit("/", 1)[1]] if ref else node


class Finding(NamedTuple):
    """One problem the schema finds, and the values it makes unfit to read further: a wrong
    value itself, an unknown key, a required key that is missing (a misspelt queue name leaves
    its settings fit to check, so it names none)."""

    problem: Problem
    invalid: tuple[Path, ...]


def check(doc: Document) -> list[Finding]:
    """Everything the schema finds wrong in ``doc``."""
    validator = jsonschema.Draft202012Validator(schema())
    findings: list[Finding] = []
    for error in validator.iter_errors(doc.data):
        findings += _translate(error, doc)
    return findings


def _translate(error: jsonschema.ValidationError, doc: Document) -> list[Finding]:
    path: Path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = [k for k in error.instance if k not in allowed]
        return [_unknown_key(doc, path, key, allowed) for key in extra]
    if error.validator == "propertyNames":
        bad = error.instance
        hint = error.schema.get("propertyNames", {}).get("x-hint", "")
        problem = Problem(doc.key_pos((*path, bad)), path, f"invalid name {bad!r}; {hint}")
        return [Finding(problem, ())]  # the name is wrong, not its value
    if error.validator == "required":
        missing = tuple((*path, key) for key in error.validator_value if key not in error.instance)
        return [Finding(Problem(doc.key_pos(path), path, error.message), missing)]
    message = error.message
    if holds_secret(doc, path):
        message = _without_value(error)
    elif error.validator in ("type", "pattern", "anyOf") and "x-hint" in error.schema:
        message = f"{error.instance!r} is not valid here; {error.schema['x-hint']}"
    elif "x-hint" in error.schema:
        message = f"{message}; {error.schema['x-hint']}"
    return [Finding(Problem(doc.value_pos(path), path, message), (path,))]


def _without_value(error: jsonschema.ValidationError) -> str:
    """The schema's complaint in words that do not quote the value."""
    if error.validator == "type":
        expected = "string" if error.schema.get("x-text") else error.validator_value
        names = expected if isinstance(expected, list) else [expected]
        what = f"must be {' or '.join(map(_a_kind, names))}, not {kind_of(error.instance)}"
    elif error.validator == "minLength":
        what = f"must be at least {error.validator_value} characters long"
    else:
        what = "is not valid here"
    hint = error.schema.get("x-hint")
    return f"{what}; {hint} {NOT_SHOWN}" if hint else f"{what} {NOT_SHOWN}"


def _a_kind(json_type: str) -> str:
    return {"object": "a mapping", "array": "a list", "integer": "an integer"}.get(
        json_type, f"a {json_type}"
    )


# Keys that moved: (the mapping they were in, the key) -> where they are now.
MOVED = {("limits", k): f"resources.{k}" for k in ("address_space", "open_files", "cpu_time")}


def _unknown_key(doc: Document, path: Path, key: str, allowed: list[str]) -> Finding:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    moved = MOVED.get((str(path[-1]) if path else "", key))
    if moved:
        hint = f"moved to {moved} (a handler's own limits are under resources:)"
    elif close:
        hint = f"did you mean {close[0]!r}?"
    else:
        hint = f"expected one of: {', '.join(allowed)}"
    where = (*path, key)
    return Finding(Problem(doc.key_pos(where), where, f"unknown key {key!r}; {hint}"), (where,))
