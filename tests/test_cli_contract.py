"""The command line's contract (issue 33): ``--json`` on every command a script reads, one
exit-code table (at the end of every --help, and in docs/reference/exit-codes.md), `dlq purge`
asking first, `events --after now`, `status --watch` ending 0 on a signal, shell completion and
man pages made from the parser."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, jobd_cli, wait_until

from jobd.cli import exits
from jobd.cli.arguments import build_parser
from jobd.cli.completion import walk

ROOT = Path(__file__).resolve().parent.parent
Daemon = Callable[..., DaemonProcess]
JOBD = [sys.executable, "-m", "jobd"]


def parsers() -> Iterator[tuple[str, object]]:
    """Every command's parser, subcommands included, by its words after `jobd`."""
    for node in walk(build_parser()).all():
        yield " ".join(node.path[1:]), node.parser


def test_every_help_ends_with_the_exit_code_table() -> None:
    seen = 0
    for name, parser in parsers():
        text = parser.format_help()  # type: ignore[attr-defined]
        table = text[text.index("exit status (docs/reference/exit-codes.md):") :]
        for code, meaning in exits.COMMON:
            assert f"{code:>5}  {meaning.split(':')[0]}" in table, (name, code, table)
        seen += 1
    assert seen > 15  # every command and dlq's actions
    help_text = jobd_cli("cancel", "--help").stdout.decode()
    assert "    4  cancel: --wait" in help_text and "   75  cancel:" in help_text
    assert "    3  not found" in jobd_cli("dlq", "q", "requeue", "--help").stdout.decode()


def test_the_exit_code_page_is_the_table() -> None:
    page = (ROOT / "docs/reference/exit-codes.md").read_text()
    assert page == exits.markdown(), "regenerate: python -m jobd.cli.exits > docs/reference/..."
    for code, meaning in exits.COMMON:
        assert f"| {code} | {meaning} |" in page


DLQ_CONFIG = """\
redis: {{url: '{{redis}}'}}
queues:
  q: {{command: [/bin/sh, -c, 'test -e {fixed} || exit 65']}}
"""


@pytest.fixture
def dead(r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path) -> str:
    """A config whose queue q has two dead letters, jobs order-0 and one whose id holds an
    escape character (ESC [31m); a daemon runs it."""
    config = str(write_config(DLQ_CONFIG.format(fixed=tmp_path / "fixed")))
    daemon(Path(config))
    for job_id in ("order-0", "red-\x1b[31m"):
        added = jobd_cli("enqueue", "-c", config, "q", "p", "--job-id", job_id, "--json")
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout) == {"queue": "q", "job_id": job_id, "durable": None}
    wait_until(lambda: r.xlen("{jobd:q}:dead") == 2, what="both jobs dead-lettered")
    return config


def test_dlq_json_and_not_found_exits_3(dead: str, r: redis.Redis, tmp_path: Path) -> None:
    listed = json.loads(jobd_cli("dlq", "-c", dead, "q", "list", "--json").stdout)
    assert listed["stream"] == "{jobd:q}:dead"
    assert [rec["job_id"] for rec in listed["records"]] == ["red-\x1b[31m", "order-0"]
    assert listed["records"][0]["fields"]["jobd_error"] == "exit"
    shown = jobd_cli("dlq", "-c", dead, "q", "show", "red-\x1b[31m", "--json")
    assert json.loads(shown.stdout)["fields"]["jobd_job_id"] == "red-\x1b[31m"  # not \\x1b
    assert b"\x1b" not in shown.stdout  # the encoder escapes it: \u001b

    assert jobd_cli("dlq", "-c", dead, "q", "show", "nope").returncode == 3
    missing = jobd_cli("dlq", "-c", dead, "q", "requeue", "order-0", "nope", "--json")
    assert missing.returncode == 3 and b"no dead letter 'nope'" in missing.stderr
    assert json.loads(missing.stdout)["missing"] == ["nope"]
    assert r.xlen("{jobd:q}:dead") == 2  # nothing requeued when one is missing

    (tmp_path / "fixed").touch()
    requeued = jobd_cli("dlq", "-c", dead, "q", "requeue", "order-0", "--json")
    assert requeued.returncode == 0, requeued.stderr
    body = json.loads(requeued.stdout)
    assert len(body["requeued"]) == 1 and body["left"] == [] and body["stream"] == "jobd:q"


def test_dlq_purge_asks_on_a_terminal_and_refuses_without_one(dead: str, r: redis.Redis) -> None:
    refused = jobd_cli("dlq", "-c", dead, "q", "purge", stdin=b"y\n")  # stdin no terminal
    assert refused.returncode == 2 and b"--yes" in refused.stderr
    assert r.xlen("{jobd:q}:dead") == 2
    assert on_terminal(["dlq", "-c", dead, "q", "purge"], b"n\n") == (1, True)
    assert r.xlen("{jobd:q}:dead") == 2
    assert on_terminal(["dlq", "-c", dead, "q", "purge"], b"y\n") == (0, True)
    assert r.xlen("{jobd:q}:dead") == 0
    purged = jobd_cli("dlq", "-c", dead, "q", "purge", "--yes", "--json")
    assert purged.returncode == 0 and json.loads(purged.stdout)["purged"] == 0


# -- others' keys and records against the readers (review 4 of issue 32) -------------------------
QUEUES = "queues:\n  q:\n    command: [/bin/cat]\n"
CONFIG = "redis: {url: '{redis}'}\n" + QUEUES


@pytest.mark.parametrize("key", ["{jobd:q}:delayed", "{jobd:q}:dead"])
def test_status_json_reads_someone_elses_key_as_the_text_status_does(
    r: redis.Redis, write_config: Callable[..., Path], key: str
) -> None:
    """A count Redis answers with an error (a key of another type) is null, '-' in the text."""
    config = str(write_config(CONFIG))
    r.set(key, "not jobd's")
    text = jobd_cli("status", "-c", config)
    assert text.returncode == 0, text.stderr
    field = "delayed" if key.endswith("delayed") else "dead-lettered"
    assert re.search(rf" {field} -(  |\n)", text.stdout.decode()), text.stdout.decode()
    done = jobd_cli("status", "-c", config, "--json")
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    assert done.returncode == 0
    status = json.loads(done.stdout)["queues"]["q"]
    assert status["delayed" if field == "delayed" else "dead_lettered"] is None


def test_dlq_reads_a_record_with_a_failed_at_of_any_size(
    r: redis.Redis, write_config: Callable[..., Path]
) -> None:
    """A record someone else wrote to the dead-letter stream: no date, not 'Redis away'."""
    config = str(write_config(CONFIG))
    r.xadd("{jobd:q}:dead", {"jobd_failed_at": "9" * 20, "jobd_job_id": "far"})
    r.xadd("{jobd:q}:dead", {"jobd_failed_at": "9" * 5000, "jobd_job_id": "wide"})
    r.xadd("{jobd:q}:dead", {"jobd_failed_at": "9" * 18, "jobd_job_id": "year-past-9999"})
    listed = jobd_cli("dlq", "-c", config, "q", "list")
    assert b"cannot reach Redis" not in listed.stderr, listed.stderr.decode()
    assert listed.returncode == 0
    assert listed.stdout.count(b"failed=?\n") == 3, listed.stdout.decode()
    as_json = jobd_cli("dlq", "-c", config, "q", "list", "--json")
    assert b"Traceback" not in as_json.stderr, as_json.stderr.decode()
    assert as_json.returncode == 0
    failed_at = [rec["failed_at"] for rec in json.loads(as_json.stdout)["records"]]
    assert failed_at == [int("9" * 18), None, None]  # an exact integer, as `jobd events` says


@pytest.mark.parametrize(
    "args",
    [["list"], ["list", "--json"], ["show", "1-1", "--json"], ["purge", "--yes"],
     ["requeue", "--all"]],
    ids=["list", "list-json", "show-json", "purge", "requeue-all"],
)  # fmt: skip
def test_dlq_says_a_wrong_type_dead_letter_key_in_one_line(
    r: redis.Redis, write_config: Callable[..., Path], args: list[str]
) -> None:
    """As `jobd cancel` does since review 1: an error Redis answers is one line and exit 1."""
    config = str(write_config(CONFIG))
    r.set("{jobd:q}:dead", "not jobd's")
    done = jobd_cli("dlq", "-c", config, "q", *args)
    assert done.returncode == 1, done
    said = done.stderr.decode()
    assert said.startswith("jobd dlq: Redis answered with an error: WRONGTYPE "), said
    assert said.count("\n") == 1, said


def test_only_an_error_of_redis_is_redis_away(
    write_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError the command's own code raises (a write to a full disk, a date out of range)
    is no 'cannot reach Redis' (exit 69): only one from Redis's client is."""
    from jobd.cli.common import Unreachable, store_for
    from jobd.config import load

    config = load(str(write_config(CONFIG)), {"PATH": os.environ["PATH"]})
    with pytest.raises(OSError, match="No space left"), store_for(config, "test"):
        raise OSError(28, "No space left on device")
    with pytest.raises(BrokenPipeError), store_for(config, "test"):
        raise BrokenPipeError(32, "Broken pipe")
    assert capsys.readouterr().err == ""
    away = load(str(write_config("redis: {url: 'redis://127.0.0.1:1'}\n" + QUEUES)), {})
    with pytest.raises(Unreachable), store_for(away, "test") as store:
        store.client.ping()
    assert "cannot reach Redis at redis://127.0.0.1:1" in capsys.readouterr().err


def on_terminal(args: list[str], answer: bytes) -> tuple[int, bool]:
    """Run jobd ARGS with a terminal on stdin and stderr, answer; (exit status, asked)."""
    main, tty = pty.openpty()
    try:
        proc = subprocess.Popen([*JOBD, *args], stdin=tty, stderr=tty, stdout=subprocess.DEVNULL)
        os.close(tty)
        said = b""
        while b"[y/N]" not in said:
            assert select.select([main], [], [], 30)[0], f"no question asked: {said!r}"
            said += os.read(main, 1024)
        os.write(main, answer)
        return proc.wait(timeout=60), b"delete every dead letter of queue q" in said
    finally:
        os.close(main)


def test_controls_and_cancel_print_json(write_config, r: redis.Redis) -> None:
    config = str(write_config(DLQ_CONFIG.format(fixed="/nonexistent")))
    paused = json.loads(jobd_cli("pause", "-c", config, "q", "--json").stdout)
    assert paused["queues"][0] | {"since": 0} == {
        "queue": "q", "paused": True, "changed": True, "since": 0, "by": paused["queues"][0]["by"]
    }  # fmt: skip
    again = json.loads(jobd_cli("pause", "-c", config, "--all", "--json").stdout)
    assert again["queues"][0]["changed"] is False
    resumed = json.loads(jobd_cli("resume", "-c", config, "q", "--json").stdout)["queues"][0]
    assert resumed["changed"] and resumed["ended"]["since"] == paused["queues"][0]["since"]
    job_id = jobd_cli("enqueue", "-c", config, "q", "p").stdout.decode().strip()
    cancelled = jobd_cli("cancel", "-c", config, "q", job_id, "gone", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    jobs = json.loads(cancelled.stdout)["jobs"]
    assert [(j["job_id"], j["found"]) for j in jobs] == [(job_id, "waiting"), ("gone", "marked")]
    none = jobd_cli("cancel", "-c", config, "q", "gone2", "--json")
    assert none.returncode == 3 and json.loads(none.stdout)["jobs"][0]["found"] == "marked"


def test_bulk_enqueue_json_is_ndjson(write_config, r: redis.Redis) -> None:
    config = str(write_config(DLQ_CONFIG.format(fixed="/nonexistent")))
    out = jobd_cli("enqueue", "-c", config, "q", "--lines", "-", "--json", stdin=b"a\n\nb\n")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    ids = [e[0].decode() for e in r.xrange("jobd:q")]
    assert lines == [{"line": 1, "job_id": ids[0]}, {"line": 3, "job_id": ids[1]}]


def test_events_after_now_shows_only_new_events(write_config, r: redis.Redis, tmp_path) -> None:
    config = str(write_config(DLQ_CONFIG.format(fixed="/nonexistent")))
    jobd_cli("pause", "-c", config, "q")
    old = json.loads(jobd_cli("events", "-c", config, "--json").stdout)["id"]
    now = jobd_cli("events", "-c", config, "--after", "now", "--json")
    assert now.returncode == 0 and now.stdout == b"", now.stderr
    out = tmp_path / "follow"
    with out.open("wb") as f:
        follow = subprocess.Popen([*JOBD, "events", "-c", config, "--after", "now", "--follow",
                                   "--json"], stdout=f)  # fmt: skip
    try:
        wait_until(lambda: toggled(config) and out.read_bytes(), what="a new event followed")
    finally:
        follow.send_signal(signal.SIGTERM)
        assert follow.wait(timeout=30) == 0
    events = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert events and all(e["id"] > old for e in events), (old, events)


def toggled(config: str) -> bool:
    """Resume then pause q again: two new events."""
    jobd_cli("resume", "-c", config, "q")
    return jobd_cli("pause", "-c", config, "q").returncode == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_status_watch_exits_0_on_a_signal(write_config, r, tmp_path: Path, signum: int) -> None:
    config = str(write_config(DLQ_CONFIG.format(fixed="/nonexistent")))
    out = tmp_path / "watch"
    with out.open("wb") as f:
        watch = subprocess.Popen([*JOBD, "status", "-c", config, "--watch", "0.2"], stdout=f)
    try:
        wait_until(lambda: out.read_bytes().count(b"jobd status on") >= 2, what="two reports")
    finally:
        watch.send_signal(signum)
    assert watch.wait(timeout=30) == 0


def complete(words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), with the script
    `jobd completion bash` prints loaded."""
    script = (
        f"source <({' '.join(JOBD)} completion bash) && complete -p jobd >&2 && "
        f"COMP_WORDS=({words}) && COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)) && _jobd && "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stderr == b"complete -F _jobd jobd\n", done
    return done.stdout.decode().split()


def test_bash_completion_comes_from_the_parser() -> None:
    commands = list(walk(build_parser()).commands)
    assert "completion" in commands and len(commands) > 10
    assert complete("jobd ''") == commands
    assert complete("jobd dl") == ["dlq"]
    assert complete("jobd dlq myqueue ''") == ["list", "show", "requeue", "purge"]
    assert complete("jobd -c x dlq q purge --") == ["--help", "--yes", "--json"]
    assert complete("jobd validate --format ''") == ["text", "json"]
    assert complete("jobd completion ''") == ["bash", "zsh", "fish"]


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completion(shell: str) -> None:
    script = subprocess.run([*JOBD, "completion", shell], capture_output=True, check=True).stdout
    for name in walk(build_parser()).commands:
        assert f"'jobd {name}'".encode() in script
    assert (b"compdef _jobd jobd" if shell == "zsh" else b"complete -c jobd") in script
    if shutil.which(shell):  # else: the structure only
        assert subprocess.run([shell, "-n"], input=script, capture_output=True).returncode == 0


def test_man_pages_render(tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "jobd.manpages", str(tmp_path)],
                          capture_output=True, check=True)  # fmt: skip
    assert made.stdout.decode().split() == [str(tmp_path / "jobd.1"), str(tmp_path / "jobd.yaml.5")]
    one, five = (tmp_path / "jobd.1").read_text(), (tmp_path / "jobd.yaml.5").read_text()
    assert one.startswith('.\\"') and "\n.TH JOBD 1 " in one and "\n.SH EXIT STATUS\n" in one
    assert '\n.SS "jobd dlq requeue"\n' in one and "\\fB\\-\\-yes\\fR" in one
    assert "\\fBqueues.NAME.command\\fR" in five and "\\fBredis.url\\fR" in five
    if not shutil.which("groff"):
        return
    for page in ("jobd.1", "jobd.yaml.5"):
        shown = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(tmp_path / page)],
                               capture_output=True, check=True)  # fmt: skip
        assert shown.stderr == b"", shown.stderr  # no warning
        text = re.sub(r".\x08", "", shown.stdout.decode())  # overstrike (bold) undone
        assert ("EXIT STATUS" in text and "jobd cancel" in text) or "queues.NAME" in text


def test_a_yaml_syntax_error_is_shown_readably(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("queues:\n  a:\n    command: [/bin/true\n    timeout: 5s\n")
    out = jobd_cli("validate", str(path))
    assert out.returncode == 78
    assert out.stdout.decode().splitlines() == [
        f"{path}:4:12: error: YAML syntax error: expected ',' or ']', but got ':' (while parsing "
        "a flow sequence); hint: a [ list is not closed: add its ], or quote a value holding , "
        "or ]",
        "  4 |     timeout: (not shown: it may be a secret)",  # any value: a secret?
        "    |            ^",
    ]
    path.write_text("redis:\n  password: hunter2: x\nqueues:\n  a: {command: [/bin/true]}\n")
    out = jobd_cli("status", "-c", str(path))
    assert out.returncode == 78 and b"hunter2" not in out.stderr, out.stderr
    assert b"mapping values are not allowed here" in out.stderr
    assert b"\n  2 |   password: (not shown: it may be a secret)\n" in out.stderr


def test_help_and_completion_load_no_config_loader_nor_redis() -> None:
    """--help, --version and completion start in about 0.1 s: the parser imports neither the
    config's loader (jsonschema) nor Redis's client (about 0.2 s more on import)."""
    code = (
        "import sys; from jobd.cli.main import build_parser; build_parser().format_help(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('redis', 'jsonschema', "
        "'yaml') or m.startswith('jobd.config.') or m == 'jobd.config'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert done.stdout == b"[]\n", done.stdout
