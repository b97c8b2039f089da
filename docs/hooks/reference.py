"""MkDocs hook: the reference pages' generated parts, made at build time from the code
(``jobd.docgen``), in place of their markers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The checkout's own code, whatever jobd the environment has installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from jobd import docgen

MARKERS = {
    "<!-- generated: configuration -->": docgen.config_reference,
    "<!-- generated: cli -->": docgen.cli_reference,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
