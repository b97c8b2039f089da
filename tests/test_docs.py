"""The documentation (issue 33): a short README whose links lead somewhere, and reference pages
generated from the code that leave nothing out. ``mkdocs build --strict`` (in ``.ci/run``)
checks every link and anchor inside the docs site."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from jobd import docgen
from jobd.cli.arguments import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
# [text](target) and ![alt](target), the target up to a space or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_every_schema_key_has_a_description() -> None:
    """The configuration reference is made from the schema: a key without a description would
    be a row that says nothing."""
    assert docgen.missing_descriptions() == []


def test_a_key_without_a_description_is_found() -> None:
    schema = {
        "properties": {"a": {"description": "x", "type": "object", "properties": {"b": {}}}},
        "$defs": {"queue": {"properties": {"c": {"items": {"properties": {"d": {}}}}}}},
    }
    assert docgen.missing_descriptions(schema) == ["a.b", "c", "c[].d"]


def test_the_configuration_reference_lists_every_key() -> None:
    page = docgen.config_reference()
    for path, node in docgen.schema_keys(docgen.load_schema()):
        assert f"`{path}`" in page, path
        if "default" in node:
            assert f"`{path}` |" in page


def test_the_cli_reference_lists_every_command_and_option() -> None:
    page = docgen.cli_reference()
    for name in ("validate", "run", "enqueue", "dashboard", "status", "dlq", "pause", "resume",
                 "cancel", "job", "events", "schema", "script", "dlq requeue"):  # fmt: skip
        assert f"## jobd {name}\n" in page, name
    for option in ("--wait-replicas", "--unseen-for", "--ndjson", "--follow", "--listen"):
        assert f"`{option}" in page, option
    assert "--process " not in page  # internal: suppressed from --help, and from the docs


def test_the_reference_pages_have_their_markers() -> None:
    """The docs hook replaces these markers with the generated text."""
    assert "<!-- generated: configuration -->" in (DOCS / "reference/configuration.md").read_text()
    assert "<!-- generated: cli -->" in (DOCS / "reference/cli.md").read_text()
    assert build_parser().prog == "jobd"


def test_the_readme_is_short() -> None:
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move text into docs/"


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found = {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}
    return found | set(re.findall(r'id="([^"]+)"', text))


def test_every_readme_link_points_to_an_existing_file() -> None:
    """Relative links in the README lead to files of the repository (the docs pages, mostly),
    and an anchor to a heading of that page."""
    links = [m.group(1) for m in LINK.finditer(README.read_text())]
    relative = [link for link in links if not re.match(r"[a-z]+:|#", link)]
    assert any(link.startswith("docs/") for link in relative)
    for link in relative:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to {link}: no such file"
        if anchor:
            assert anchor in anchors(target), f"README.md links to {link}: no such anchor"
