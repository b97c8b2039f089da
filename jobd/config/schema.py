"""The config's JSON Schema (``schema.json``): its text, the defaults it declares, which keys
are text, and its verdict on a parsed document, in jobd's words.

The schema is the one home of the config's keys, their types and their defaults; what it
cannot express (lease timing, streams shared between queues, programs on disk) is checked in
``queue_checks``, ``cross_queue`` and ``validation``.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

from jobd.config.problems import Problem
from jobd.config.redact import NOT_SHOWN, holds_secret
from jobd.config.yamlsrc import Document, Path, kind_of

if TYPE_CHECKING:  # imported by ``check`` for a document ``fits`` cannot vouch for
    import jsonschema


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
    """Everything the schema finds wrong in ``doc``: nothing when ``fits`` vouches for it, else
    jsonschema's verdict (imported only then: ~70 ms of every command's and daemon's start)."""
    if fits(schema(), doc.data):
        return []
    import jsonschema

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


# -- a quick check, for a document without problems ----------------------------------------------

# What ``fits`` reads of the schema: keywords that say nothing of a value, and the ones it checks
# as jsonschema (Draft 2020-12, no format checking) does. Any other keyword: it cannot vouch.
SAYS_NOTHING = frozenset({"$schema", "$id", "$defs", "title", "description", "default", "x-hint",
                          "x-text", "examples", "$comment"})  # fmt: skip
TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}
SCALARS = (str, int, float, bool, type(None))


def fits(node: Any, value: Any) -> bool:
    """True only when ``value`` is valid against schema ``node``: jsonschema would find nothing.
    False when it is not, or when this cannot tell (a keyword it does not know, a value it does
    not compare): then jsonschema decides. Never True where jsonschema finds a problem."""
    if isinstance(node, bool):
        return node
    return all(_keyword_fits(key, want, node, value) for key, want in node.items())


def _keyword_fits(key: str, want: Any, node: dict[str, Any], value: Any) -> bool:
    """One keyword of ``node``, as jsonschema's own table of keywords checks it."""
    if key in SAYS_NOTHING:
        return True
    if key == "$ref":
        target = schema()["$defs"].get(want.removeprefix("#/$defs/"))
        return want.startswith("#/$defs/") and target is not None and fits(target, value)
    if key == "type":
        names = want if isinstance(want, list) else [want]
        return any(name in TYPES and TYPES[name](value) for name in names)
    if key in ("properties", "additionalProperties", "required", "minProperties", "propertyNames"):
        return not isinstance(value, dict) or _object_fits(key, want, node, value)
    if key in ("items", "minItems", "uniqueItems"):
        return not isinstance(value, list) or _array_fits(key, want, value)
    if key in ("minLength", "maxLength", "pattern"):
        if not isinstance(value, str):
            return True
        if key == "pattern":
            return re.search(want, value) is not None
        return len(value) >= want if key == "minLength" else len(value) <= want
    if key in ("minimum", "maximum"):
        if not TYPES["number"](value):
            return True
        return not value < want if key == "minimum" else not value > want
    if key == "enum":
        return any(_same(value, each) for each in want)
    if key == "const":
        return _same(value, want)
    if key == "anyOf":
        return any(fits(each, value) for each in want)
    return False  # a keyword not known here


def _object_fits(key: str, want: Any, node: dict[str, Any], value: dict[str, Any]) -> bool:
    if key == "properties":
        return all(fits(want[k], v) for k, v in value.items() if k in want)
    if key == "additionalProperties":
        known = node.get("properties", {})
        if "patternProperties" in node:
            return False  # not read here
        return all(fits(want, v) for k, v in value.items() if k not in known)
    if key == "required":
        return all(k in value for k in want)
    if key == "minProperties":
        return len(value) >= want
    return all(fits(want, k) for k in value)  # propertyNames


def _array_fits(key: str, want: Any, value: list[Any]) -> bool:
    if key == "items":
        return all(fits(want, v) for v in value)
    if key == "minItems":
        return len(value) >= want
    if not want:  # uniqueItems: false
        return True
    if not all(isinstance(v, SCALARS) for v in value):
        return False  # not compared here
    seen = {(isinstance(v, bool), type(v) is str, v) for v in value}  # 1 == 1.0, True != 1
    return len(seen) == len(value)


def _same(value: Any, want: Any) -> bool:
    """Equal as jsonschema says for a scalar of the same type; anything else: cannot tell."""
    return isinstance(want, SCALARS) and type(value) is type(want) and value == want
