"""The package's layout (issue 18): small modules, short functions, and every module and
subpackage saying what it owns.

No module of jobd over ``MAX_MODULE_LINES`` lines; no function or method over
``MAX_FUNCTION_LINES`` (from its ``def`` to its last line, decorators excluded) unless a comment
``# long: why`` stands on the line of its ``def`` or on the line just above. Every module has a
docstring, and so does the ``__init__.py`` every subpackage must have."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

JOBD = Path(__file__).resolve().parent.parent / "jobd"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
WHY = "# long:"


def modules() -> list[Path]:
    return sorted(p for p in JOBD.rglob("*.py") if "__pycache__" not in p.parts)


def shown(path: Path) -> str:
    return str(path.relative_to(JOBD.parent)) if path.is_relative_to(JOBD.parent) else str(path)


def comments(text: str) -> dict[int, str]:
    """The comment on each line of ``text`` that has one, by line number."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string
    return found


def explained(comment: str | None) -> bool:
    """Whether ``comment`` is a ``# long:`` comment that says why."""
    return bool(comment and comment.startswith(WHY) and comment[len(WHY) :].strip())


def long_functions(path: Path) -> list[str]:
    """``file:line: name has N lines`` for each function or method of ``path`` over the limit
    that no ``# long:`` comment explains."""
    text = path.read_text()
    said = comments(text)
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        why = explained(said.get(node.lineno)) or explained(said.get(node.lineno - 1))
        if length > MAX_FUNCTION_LINES and not why:
            found.append(f"{shown(path)}:{node.lineno}: {node.name} has {length} lines")
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_no_module_is_over_the_limit() -> None:
    found = []
    for path in modules():
        length = len(path.read_text().splitlines())
        if length > MAX_MODULE_LINES:
            found.append(f"{shown(path)}:1: {length} lines")
    assert not found, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(found)


def test_no_function_is_over_the_limit_unless_a_comment_says_why() -> None:
    found = [line for path in modules() for line in long_functions(path)]
    assert not found, (
        f"functions over {MAX_FUNCTION_LINES} lines with no '{WHY} why' comment on the line of "
        "their def or the line above:\n" + "\n".join(found)
    )


def test_every_module_says_what_it_owns() -> None:
    found = [shown(p) for p in modules() if not ast.get_docstring(ast.parse(p.read_text()))]
    assert not found, "modules with no docstring:\n" + "\n".join(found)


def test_every_subpackage_has_an_init_that_says_what_it_owns() -> None:
    packages = sorted({p.parent for p in modules()})
    assert JOBD / "config" in packages, "the subpackages are found"
    found = []
    for package in packages:
        init = package / "__init__.py"
        if not init.exists():
            found.append(f"{shown(package)}: no __init__.py")
        elif not ast.get_docstring(ast.parse(init.read_text())):
            found.append(f"{shown(init)}: no docstring")
    assert not found, "subpackages that do not say what they own:\n" + "\n".join(found)


# -- the checker itself ---------------------------------------------------------------------------


def function(name: str, lines: int, before: str = "", on_def: str = "") -> str:
    """A function of ``lines`` lines in all, ``before`` on the line above its def and ``on_def``
    after it."""
    head = f"{before}\n" if before else ""
    return head + f"def {name}():{on_def}\n" + "    x = 1\n" * (lines - 1)


def test_the_checker_counts_from_the_def_and_reads_the_comments(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        function("fits", 50)
        + function("above", 51, before="# long: one table, read top to bottom")
        + function("on_def", 60, on_def="  # long: a state machine, one branch a state")
        + function("unexplained", 51, before="# long:")
        + function("other_comment", 52, before="# a comment that says nothing of length")
        + "@decorated\n"
        + "@twice\n"
        + function("decorators_not_counted", 50)
        + "class C:\n"
        + "\n".join("    " + line for line in function("method", 53).splitlines())
        + "\n"
    )
    found = long_functions(path)
    lines = [line.split(": ", 1)[1] for line in found]
    assert lines == [
        "unexplained has 51 lines",
        "other_comment has 52 lines",
        "method has 53 lines",
    ]
    assert found[0].startswith(f"{path}:164: ")  # after 50 + (1 + 51) + 60 lines and its comment
