"""The command line as a user runs it: `python -m jobd …` and the `jobd` script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import redis
import yaml
from support import jobd_cli

ROOT = Path(__file__).resolve().parent.parent


def test_validate_valid_config_prints_a_summary_and_each_queues_worst_case(
    write_config: Callable[..., Path],
) -> None:
    path = write_config("redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n")
    result = jobd_cli("validate", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 2 and " OK: 1 queue(s) (a) on redis://127.0.0.1:" in lines[0]
    assert lines[1].startswith("queue a: worst case in Redis "), lines[1]


def test_validate_accepts_c_and_jobd_config(write_config: Callable[..., Path]) -> None:
    path = write_config("queues:\n  a: {command: [/bin/true]}\n")
    assert jobd_cli("validate", "-c", str(path)).returncode == 0
    assert jobd_cli("validate", env={"JOBD_CONFIG": str(path)}).returncode == 0


def test_validate_and_run_refuse_a_stream_that_is_another_queues_level(
    write_config: Callable[..., Path],
) -> None:
    """`b` reading `a`'s level 'high' would run a's jobs under b's command (and a b's)."""
    path = write_config(
        "redis: {url: '{redis}'}\nqueues:\n"
        "  a: {stream: s, command: [/bin/true], priorities: [high, low]}\n"
        "  b: {stream: '{s}:priority:high', command: [/bin/true]}\n"
    )
    for command in ("validate", "run"):
        result = jobd_cli(command, str(path))
        assert result.returncode == 78, result.stderr
        assert (
            f"{path}:4:15: error: queues.b.stream: the stream '{{s}}:priority:high' is the stream "
            "of priority level 'high' of queue 'a'"
        ) in (result.stdout + result.stderr).decode()


def test_validate_invalid_exits_78_with_every_problem(write_config: Callable[..., Path]) -> None:
    path = write_config(
        "queues:\n  a:\n    command: [/bin/true]\n    concurency: 0\n    timeout: x\n"
    )
    result = jobd_cli("validate", str(path))
    assert result.returncode == 78
    lines = result.stdout.decode().splitlines()
    assert lines == [
        f"{path}:4:5: error: queues.a.concurency: unknown key 'concurency'; did you mean 'concurrency'?",
        f"{path}:5:14: error: queues.a.timeout: 'x' is not valid here; write a duration like "
        "250ms, 30s, 5m, 2h, 1d, or a number of seconds",
    ]


def test_validate_json_format(write_config: Callable[..., Path]) -> None:
    path = write_config("queues:\n  a:\n    command: [/bin/true]\n    concurrency: 0\n")
    result = jobd_cli("validate", str(path), "--format", "json")
    assert result.returncode == 78
    body = json.loads(result.stdout)
    assert body["valid"] is False
    assert body["errors"] == [
        {
            "line": 4,
            "column": 18,
            "path": "queues.a.concurrency",
            "message": "0 is less than the minimum of 1",
        }
    ]
    good = write_config("queues:\n  a: {command: [/bin/true]}\n", name="good.yaml")
    body = json.loads(jobd_cli("validate", str(good), "--format", "json").stdout)
    assert body["valid"] is True and list(body["queues"]) == ["a"]
    queue = body["queues"]["a"]
    assert {k: queue[k] for k in ("stream", "group", "prefetch")} == {
        "stream": "jobd:a",
        "group": "jobd",
        "prefetch": "auto",
    }
    assert queue["effective"]["retention"]["maxlen"] == 1000 and queue["worst_case"]


@pytest.mark.parametrize("kind", ["missing", "directory", "empty", "list", "binary"])
def test_validate_bad_files_one_line_no_traceback(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text("")
    elif kind == "list":
        path.write_text("- a\n")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)))
    result = jobd_cli("validate", str(path))
    assert result.returncode == 78
    out = result.stdout.decode().splitlines()
    assert len(out) == 1 and out[0].startswith(f"{path}") and ": error: " in out[0]
    assert b"Traceback" not in result.stderr + result.stdout


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert jobd_cli("validate", "--bogus").returncode == 2
    assert jobd_cli().returncode == 2
    assert jobd_cli("validate", "a.yaml", "-c", "b.yaml").returncode == 2


def test_run_refuses_an_invalid_config_with_78(write_config: Callable[..., Path]) -> None:
    path = write_config("queues:\n  a: {command: [/bin/true], concurrency: 0}\n")
    result = jobd_cli("run", str(path))
    assert result.returncode == 78
    assert b"queues.a.concurrency: 0 is less than the minimum of 1" in result.stderr


def test_schema_is_draft_2020_12_and_accepts_the_examples() -> None:
    result = jobd_cli("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    for example in (ROOT / "config").glob("*.yaml"):
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(example.read_text()))


def test_example_config_validates() -> None:
    result = jobd_cli("validate", str(ROOT / "config" / "example.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_console_script_and_version() -> None:
    script = shutil.which("jobd", path=str(Path(sys.executable).parent))
    assert script, "the jobd console script is installed next to the interpreter"
    result = subprocess.run([script, "--version"], capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stdout.startswith(b"jobd ")


def test_enqueue_from_argument_file_and_stdin(
    write_config: Callable[..., Path], r: redis.Redis, tmp_path: Path
) -> None:
    path = write_config("redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n")
    first = jobd_cli("enqueue", "-c", str(path), "a", "héllo")
    assert first.returncode == 0, first.stderr
    payload_file = tmp_path / "payload.bin"
    payload_file.write_bytes(b"\x00\xffbinary")
    second = jobd_cli("enqueue", "-c", str(path), "a", "--payload-file", str(payload_file))
    third = jobd_cli("enqueue", "-c", str(path), "a", "--job-id", "order-42", stdin=b"from stdin\n")
    assert third.stdout == b"order-42\n"
    entries = r.xrange("jobd:a")
    assert [e[0].decode() for e in entries[:2]] == [
        first.stdout.decode().strip(),
        second.stdout.decode().strip(),
    ]
    assert [e[1] for e in entries] == [
        {b"payload": "héllo".encode()},
        {b"payload": b"\x00\xffbinary"},
        {b"payload": b"from stdin\n", b"job_id": b"order-42"},
    ]


def test_enqueue_wait_replicas_says_when_fewer_replicas_have_the_job(
    write_config: Callable[..., Path], r: redis.Redis
) -> None:
    path = str(write_config("redis: {url: '{redis}'}\nqueues:\n  a: {command: [/bin/true]}\n"))
    none_asked = jobd_cli("enqueue", "-c", path, "a", "one", "--wait-replicas", "0")
    assert none_asked.returncode == 0, none_asked.stderr
    # The test server has no replica: the job is enqueued, but not confirmed durable.
    short = jobd_cli("enqueue", "-c", path, "a", "two", "--wait-replicas", "1",
                     "--wait-timeout", "100ms", "--job-id", "j-2")  # fmt: skip
    assert short.returncode == 75 and short.stdout == b"j-2\n"
    assert b"job j-2 is enqueued, but only 0 of 1 replica(s) received it within 0.1s" in (
        short.stderr
    )
    later = jobd_cli("enqueue", "-c", path, "a", "three", "--wait-replicas", "1",
                     "--wait-timeout", "100ms", "--delay", "1h")  # fmt: skip
    assert later.returncode == 75 and b"only 0 of 1 replica(s)" in later.stderr
    assert [e[1][b"payload"] for e in r.xrange("jobd:a")] == [b"one", b"two"]
    assert r.zcard("{jobd:a}:delayed") == 1
    bad = jobd_cli("enqueue", "-c", path, "a", "x", "--wait-replicas", "1", "--wait-timeout", "x")
    assert bad.returncode == 2 and b"--wait-timeout" in bad.stderr


def test_enqueue_wait_aof(write_config: Callable[..., Path], durable_redis) -> None:
    path = write_config(
        f"redis: {{url: '{durable_redis.url}'}}\nqueues:\n  a: {{command: [/bin/true]}}\n"
    )
    out = jobd_cli("enqueue", "-c", str(path), "a", "x", "--wait-aof", "--job-id", "j")
    with redis.Redis(port=durable_redis.port) as client:
        version = tuple(int(p) for p in client.info("server")["redis_version"].split(".")[:2])
        assert client.xlen("jobd:a") == 1
    if version >= (7, 2):  # WAITAOF: the master's append-only file has it on disk
        assert out.returncode == 0 and out.stdout == b"j\n", out.stderr
    else:
        assert out.returncode == 75 and out.stdout == b"j\n"
        assert b"durability is unknown" in out.stderr and b"WAITAOF needs Redis 7.2" in out.stderr


def test_enqueue_unknown_queue_and_unreachable_redis(write_config: Callable[..., Path]) -> None:
    path = write_config(
        "redis: {url: 'redis://127.0.0.1:1/0'}\nqueues:\n  a: {command: [/bin/true]}\n"
    )
    unknown = jobd_cli("enqueue", "-c", str(path), "b", "x")
    assert unknown.returncode == 2 and b"no queue 'b'" in unknown.stderr
    down = jobd_cli("enqueue", "-c", str(path), "a", "x")
    assert down.returncode == 69 and b"cannot reach Redis" in down.stderr
    assert b"Traceback" not in down.stderr


def test_a_script_loaded_from_jobd_script_schedules_a_job_another_language_would(
    r: redis.Redis,
) -> None:
    """Another language loads what `jobd script schedule` prints (the file alone lacks the
    library it names) and calls it as the README says: the job lands in the delayed set."""
    printed = jobd_cli("script", "schedule")
    assert printed.returncode == 0 and b"local MAX_FIELDS" in printed.stdout
    sha = r.script_load(printed.stdout)
    assert r.evalsha(sha, 1, "{jobd:q}:delayed", "+60000", "token-1", "payload", "hi") == 1
    assert r.zcard("{jobd:q}:delayed") == 1
    with pytest.raises(redis.ResponseError, match="name, value pairs"):
        r.evalsha(sha, 1, "{jobd:q}:delayed", "+0", "token-2", "payload")
    missing = jobd_cli("script", "nope")
    assert missing.returncode == 2 and b"scripts: acquire" in missing.stderr
