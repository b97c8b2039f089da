"""Reference pages generated from the code, never written by hand: the configuration keys from
the JSON schema (``jobd/config/schema.json``) and the command line from the argument parser
(``jobd.cli.arguments.build_parser``). The docs site's hook (``docs/hooks/reference.py``) puts
them into their pages at build time; ``tests/test_docs.py`` checks the schema is documented."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).parent / "config" / "schema.json"

# What the schema's named value forms are called in the reference.
_DEFS = {"duration": "duration", "size": "size", "stream_key": "string", "queue": "queue"}


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text())


def schema_keys(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every key of the config as (dotted path, its schema), parents before their children:
    the top level's, then a queue's (``queues.NAME.`` and ``defaults.``), ``schedule[].`` for
    an array's items."""
    yield from _walk(schema["properties"], "", schema)
    yield from _walk(schema["$defs"]["queue"]["properties"], "", schema)


def _walk(props: dict[str, Any], prefix: str, schema: dict[str, Any]) -> Iterator[tuple]:
    for name, node in props.items():
        path = prefix + name
        yield path, node
        if node.get("$ref") == "#/$defs/queue":
            continue  # a queue's keys are listed once, in their own table
        if "properties" in node:
            yield from _walk(node["properties"], path + ".", schema)
        items = node.get("items", {})
        if "properties" in items:
            yield from _walk(items["properties"], path + "[].", schema)


def _type(node: dict[str, Any]) -> str:
    if "$ref" in node:
        return _DEFS.get(node["$ref"].rsplit("/", 1)[-1], "object")
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(value) for value in node["enum"])
    if "anyOf" in node or "oneOf" in node:
        return " or ".join(_type(choice) for choice in node.get("anyOf", node.get("oneOf")))
    kind = node.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array" and "items" in node:
        return f"list of {_type(node['items'])}"
    if kind == "object" and "additionalProperties" in node and "properties" not in node:
        extra = node["additionalProperties"]
        return f"mapping of {_type(extra)}" if isinstance(extra, dict) else "mapping"
    return kind


def _md(text: str) -> str:
    """Text for a Markdown table cell: code spans kept, elsewhere the characters Markdown
    would read as markup escaped."""
    parts = text.replace("\n", " ").split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: no code span at all
        return "\\`".join(_escape(part) for part in parts)
    return "`".join(part if index % 2 else _escape(part) for index, part in enumerate(parts))


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return text.replace("*", "\\*").replace("[", "\\[").replace("_", "\\_")


def _row(path: str, node: dict[str, Any]) -> str:
    default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
    anchor = path.replace(".", "-").replace("[]", "")
    return (
        f'| <a id="{anchor}"></a>`{path}` | {_md(_type(node))} | {default} '
        f"| {_md(node.get('description', ''))} |"
    )


def config_reference(schema: dict[str, Any] | None = None) -> str:
    """The configuration reference: one table for the top level, one for a queue's keys."""
    schema = schema or load_schema()
    head = "| key | type | default | what it is |\n|---|---|---|---|"
    top = [_row(path, node) for path, node in _walk(schema["properties"], "", schema)]
    queue_keys = schema["$defs"]["queue"]["properties"]
    queue = [_row(path, node) for path, node in _walk(queue_keys, "", schema)]
    return "\n".join(
        [
            "## Top-level keys",
            "",
            head,
            *top,
            "",
            "## Queue keys",
            "",
            "Each key below may be set under `queues.NAME` and, for every queue at once, under "
            "`defaults` (a queue's own value wins; mappings merge key by key).",
            "",
            head,
            *queue,
            "",
        ]
    )


def missing_descriptions(schema: dict[str, Any] | None = None) -> list[str]:
    """The keys of the schema that have no description (the reference would be silent)."""
    schema = schema or load_schema()
    return [path for path, node in schema_keys(schema) if not node.get("description")]


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The command-line reference: each command's usage, arguments and epilog, as the parser
    has them (``jobd COMMAND --help`` says the same)."""
    if parser is None:
        from jobd.cli.arguments import build_parser

        parser = build_parser()
    return "\n".join(_command(parser, "jobd", level=2))


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, Any]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _command(parser: argparse.ArgumentParser, name: str, level: int) -> Iterator[str]:
    subs = list(_subcommands(parser))
    usage = parser.format_usage().removeprefix("usage: ").strip()
    usage = " ".join(usage.split()).replace(parser.prog, name, 1)
    yield from ("```text", usage, "```", "")
    if parser.description:
        yield from (_md(parser.description), "")
    rows = [_argument(action) for action in parser._actions if _shown(action)]
    if rows:
        yield from ("| argument | default | what it does |", "|---|---|---|", *rows, "")
    if parser.epilog:
        yield from ("```text", parser.epilog.strip(), "```", "")
    for sub_name, help_text, sub in subs:
        yield from (f"{'#' * level} {name} {sub_name}", "")
        if help_text:
            yield from (_md(help_text[0].upper() + help_text[1:]) + ".", "")
        yield from _command(sub, f"{name} {sub_name}", min(level + 1, 4))


def _shown(action: argparse.Action) -> bool:
    return action.help != argparse.SUPPRESS and not isinstance(
        action, argparse._SubParsersAction | argparse._HelpAction
    )


def _argument(action: argparse.Action) -> str:
    metavar = action.metavar or action.dest.upper()
    if action.choices and not action.metavar:
        metavar = "{" + ",".join(str(choice) for choice in action.choices) + "}"
    if not action.option_strings:
        spelled = str(metavar)
    elif action.nargs == 0:
        spelled = ", ".join(action.option_strings)
    else:
        spelled = f"{', '.join(action.option_strings)} {metavar}"
    quiet = action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0
    default = "" if quiet else f"`{action.default}`"
    return f"| `{spelled}` | {default} | {_md(action.help or '')} |"
