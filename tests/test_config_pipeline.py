"""The config pipeline (issue 18): parse → check everything → build. One run of `jobd validate`
reports every problem of a file, whatever else is wrong in it; the jobd modules import each
other without a cycle. (That they stay small is checked for every module in test_layout.py.)"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import jobd_cli

from jobd.cli import main as cli
from jobd.config import ConfigError, load, schema

JOBD = Path(__file__).resolve().parent.parent / "jobd"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobd.yaml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(str(path), {"PATH": os.environ["PATH"]})
    return [p.format("f") for p in info.value.problems]


# -- every problem of a file in one run ---------------------------------------------------------

EVERYTHING_WRONG = """\
redis:
  url: redis://h:63x79/0
  password_file: missing.pw
dashboard:
  actions: true
queues:
  email:
    command: [/bin/true]
    concurrency: 0
    lease: {renew_every: 30s, reclaim_after: 1m}
  thumbs:
    command: [./missing.sh]
"""


def expected_everything_wrong(name: str, folder: Path) -> list[str]:
    return [
        f"{name}:2:8: error: redis.url: cannot be read as written: its port is not a number, or "
        "its user name or password holds '/', '?', '#' or '@', which must be percent-encoded "
        "there (%2F, %3F, %23, %40) (the value is not shown: it may be a secret)",
        f"{name}:3:18: error: redis.password_file: cannot read {folder}/missing.pw: No such file "
        "or directory",
        f"{name}:5:12: error: dashboard.actions: actions need a token: set dashboard.token_file or "
        "dashboard.token_credential",
        f"{name}:9:18: error: queues.email.concurrency: 0 is less than the minimum of 1",
        f"{name}:10:26: error: queues.email.lease.renew_every: 30s is not well below "
        "lease.reclaim_after (1m): a lease must survive 2 missed renewals; set renew_every to 20s "
        "or less",
        f"{name}:12:15: error: queues.thumbs.command.0: '{folder}/missing.sh' does not exist",
    ]


def test_validate_reports_schema_semantic_redis_and_dashboard_problems_in_one_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema error (concurrency: 0) used to hide its own queue's lease problem and every
    problem of redis and dashboard; of those only the first was ever reported."""
    path = write(tmp_path, EVERYTHING_WRONG)
    assert cli.main(["validate", str(path)]) == 78
    out = capsys.readouterr()
    assert out.out.splitlines() == expected_everything_wrong(str(path), tmp_path)
    assert cli.main(["validate", str(path), "--format", "json"]) == 78
    body = json.loads(capsys.readouterr().out)
    assert body["valid"] is False
    shown = [f"{path}:{e['line']}:{e['column']}: error: {e['path']}: {e['message']}"
             for e in body["errors"]]  # fmt: skip
    assert shown == expected_everything_wrong(str(path), tmp_path)


def test_redis_problems_are_all_reported_together(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "redis:\n  url: redis://h/0\n  cluster: {nodes: ['a:1']}\n  tls: {ca_file: ca.pem}\n"
        "  password: x\n  password_file: pw\n"
        "queues:\n  a: {command: [/bin/true]}\n",
    )
    assert problems(path) == [
        "f:3:12: error: redis.cluster: give one of redis.url, redis.cluster, not several",
        "f:4:8: error: redis.tls: TLS is supported with redis.url (rediss://) only, not yet with "
        "a cluster or Sentinel; reach those over a private network or a TLS tunnel",
        "f:6:18: error: redis.password_file: give one of password, password_file, not several",
    ]


def test_a_problem_in_defaults_hides_no_queues_problems(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "defaults:\n  timeout: soon\n  lease: {renew_every: 1m}\n"
        "queues:\n  a: {command: [./missing.sh]}\n  b: {command: [/bin/true], retry: "
        "{backoff: 1m, max_backoff: 1s}}\n",
    )
    found = problems(path)
    assert [line.split(": error: ")[1].split(":")[0] for line in found] == [
        "defaults.timeout",
        "queues.a.lease.renew_every",  # at 3:24, in defaults, for queue a, then for queue b
        "queues.b.lease.renew_every",
        "queues.a.command.0",
        "queues.b.retry.max_backoff",
    ]
    assert found[1].startswith("f:3:24: ") and found[1].endswith("(value set in defaults)")


def test_a_check_that_needs_a_refused_value_is_skipped_not_guessed(tmp_path: Path) -> None:
    """Only the schema's problem: the lease timing, the command and the stream collisions need
    the values the schema refused, and every other check of the queue still runs."""
    path = write(
        tmp_path,
        "queues:\n"
        "  a:\n    command: [no-such-program-jobd]\n    env: {PATH: [x]}\n"
        "    lease: {renew_every: 30s, reclaim_after: later}\n    stream: [s]\n"
        "    timeout: 0s\n"
        "  b: {command: [/bin/true], stream: s}\n",
    )
    found = problems(path)
    assert [line.split(": error: ")[1].split(":")[0] for line in found] == [
        "queues.a.env.PATH",
        "queues.a.lease.reclaim_after",
        "queues.a.stream",
        "queues.a.timeout",
    ]
    assert found[3] == "f:7:14: error: queues.a.timeout: must be longer than zero"


def test_a_valid_file_still_loads_in_full(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("secret\n")
    path = write(
        tmp_path,
        "redis: {url: 'redis://h/0', password_file: pw}\n"
        "dashboard: {actions: true, token: 0123456789abcdef}\n"
        "defaults: {command: [/bin/true], lease: {renew_every: 5s}}\n"
        "queues:\n  a: {}\n  b: {lease: {reclaim_after: 2m}, priorities: [hi, lo]}\n",
    )
    config = load(str(path), {"PATH": os.environ["PATH"]})
    assert config.redis.password == "secret" and config.dashboard.token == "0123456789abcdef"
    a, b = config.queues["a"], config.queues["b"]
    assert (a.lease.renew_every, a.lease.reclaim_after) == (5, 60)
    assert (b.lease.renew_every, b.lease.reclaim_after) == (5, 120)
    assert [level.priority for level in b.all_levels()] == ["hi", "lo"]


# -- no import cycle ------------------------------------------------------------------------------


def imports_of(path: Path, modules: set[str], name: str = "") -> set[str]:
    """The jobd modules ``path`` (module ``name``) imports anywhere: at the top, in a function,
    or only for type checking (under TYPE_CHECKING). ``from P import m`` of a module m is an
    import of P.m alone (P is a package: Python imports its __init__ first, but P.m does not
    depend on what P's __init__ imports)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = node.module if not node.level else f"jobd.{node.module or ''}".rstrip(".")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return (found & modules) - {name or f"jobd.{path.stem}", "jobd"}


def module_name(path: Path) -> str:
    parts = path.relative_to(JOBD.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for other in sorted(graph[module]):
            if state.get(other) == 1:
                return [*path[path.index(other) :], other]
            if other not in state and (cycle := walk(other)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := walk(module)):
            return cycle
    return None


def test_jobd_modules_import_each_other_without_a_cycle() -> None:
    files = {module_name(p): p for p in JOBD.rglob("*.py") if module_name(p) != "jobd"}
    graph = {module: imports_of(path, set(files), module) for module, path in files.items()}
    assert "jobd.config.validation" in graph["jobd.config"], "the graph is read"
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_check_sees_imports_made_only_for_type_checking(tmp_path: Path) -> None:
    graph = {"jobd.a": {"jobd.b"}, "jobd.b": {"jobd.a"}, "jobd.c": set()}
    assert find_cycle(graph) == ["jobd.a", "jobd.b", "jobd.a"]
    path = tmp_path / "a.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jobd.b import X\n"
    )
    assert imports_of(path, {"jobd.b", "jobd.c"}) == {"jobd.b"}
    path.write_text("def f():\n    from jobd import c\n")
    assert imports_of(path, {"jobd.b", "jobd.c"}) == {"jobd.c"}


# -- the schema's quick check: jsonschema only for a file it cannot vouch for ---------------------

ROOT = JOBD.parent
SCALARS = [None, True, False, 0, 1, -1, 1.0, 1.5, 10**12, "", "x", "1s", "5m", "auto", "{a}b",
           "jobd:q", "1KiB", [], ["/bin/true"], [1, 1.0], ["a", "a"], {}, {"x": 1}]  # fmt: skip


def corpus() -> list[dict]:
    """The documents of config/ and every YAML example of the docs that has queues, parsed as
    jobd parses them (a `${VAR}` left as written: its expansion is text)."""
    from jobd.config.source import parse

    texts = [(p, p.read_text()) for p in sorted((ROOT / "config").glob("*.yaml"))]
    for page in sorted((ROOT / "docs").rglob("*.md")):
        blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
        texts += [(page, b) for b in blocks if re.search(r"^queues:", b, re.M)]
    found = []
    for path, text in texts:
        try:
            found.append(parse(str(path), {}, text).data)
        except ConfigError:
            continue  # not a whole config (an excerpt with a placeholder)
    return found


CORPUS = corpus()


def jsonschema_errors(data: object) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema.schema())
    return [e.message for e in validator.iter_errors(data)]


def test_the_example_configs_pass_the_quick_check_as_they_pass_jsonschema() -> None:
    from jobd.config.source import parse

    assert len(CORPUS) > 5, "the docs' examples are read"
    for path in sorted((ROOT / "config").glob("*.yaml")):
        data = parse(str(path), {}).data
        assert schema.fits(schema.schema(), data), path  # else every start pays for jsonschema
    for data in CORPUS:
        assert not schema.fits(schema.schema(), data) or not jsonschema_errors(data)


def mutated(data: object, draw: st.DataObject) -> object:
    """``data`` with one value replaced, removed or added somewhere, as hypothesis draws it."""
    if isinstance(data, dict) and data and draw.draw(st.booleans()):
        key = draw.draw(st.sampled_from(sorted(data, key=str)))
        data[key] = mutated(data[key], draw)
        return data
    if isinstance(data, list) and data and draw.draw(st.booleans()):
        i = draw.draw(st.integers(0, len(data) - 1))
        data[i] = mutated(data[i], draw)
        return data
    action = draw.draw(st.sampled_from(["replace", "remove", "add"]))
    if action == "remove" and isinstance(data, dict | list) and data:
        del data[draw.draw(st.sampled_from(list(data) if isinstance(data, dict) else [0, -1]))]
        return data
    if action == "add" and isinstance(data, dict):
        key = draw.draw(st.sampled_from(["x", "timeout", "command", "retry", "lease", "cwd"]))
        data[key] = copy.deepcopy(draw.draw(st.sampled_from(SCALARS)))
        return data
    return copy.deepcopy(draw.draw(st.sampled_from(SCALARS)))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_quick_check_never_vouches_for_what_jsonschema_refuses(draw: st.DataObject) -> None:
    """``schema.fits`` may send a valid document on to jsonschema, never pass an invalid one."""
    data = copy.deepcopy(draw.draw(st.sampled_from(CORPUS)))
    for _ in range(draw.draw(st.integers(1, 3))):
        data = mutated(data, draw)
    if schema.fits(schema.schema(), data):
        assert jsonschema_errors(data) == [], data


# -- what a command imports: nothing it does not use ---------------------------------------------


def imported(stderr: bytes) -> set[str]:
    """The modules a process imported, from its PYTHONPROFILEIMPORTTIME lines."""
    lines = stderr.decode(errors="replace").splitlines()
    return {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


def test_validate_imports_neither_redis_nor_jsonschema_nor_croniter_for_a_valid_file() -> None:
    """`jobd validate` talks to no Redis; a file without problems needs no jsonschema, and one
    without schedules no croniter (whose import runs `file`). A file with a problem still gets
    jsonschema's words (the tests above)."""
    example = str(ROOT / "config" / "example.yaml")
    done = jobd_cli("validate", example, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "jobd.config" in modules, "the import lines are read"
    assert not modules & {"redis", "jsonschema", "croniter", "prometheus_client", "waitress"}
