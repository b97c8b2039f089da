"""The config: every class of error at its exact line and column, and the typed result."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from jobd.config import ConfigError, durations, load


def problems(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(str(path), environ if environ is not None else {"PATH": os.environ["PATH"]})
    return [p.format("f") for p in info.value.problems]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobd.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def true_handler(tmp_path: Path) -> Path:
    h = tmp_path / "ok.sh"
    h.write_text("#!/bin/sh\nexit 0\n")
    h.chmod(0o755)
    return h


# -- each class of error, with its line and column --------------------------------------------


def test_yaml_syntax_error_points_at_the_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [x\n    concurrency: 1\n")
    [line] = problems(path)
    assert line.startswith("f:4:16: error: YAML syntax error: ")


def test_unknown_key_gets_did_you_mean(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [/bin/true]\n    concurency: 3\n")
    assert problems(path) == [
        "f:4:5: error: queues.a.concurency: unknown key 'concurency'; did you mean 'concurrency'?"
    ]


def test_unknown_key_without_a_close_match_lists_the_keys(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a: {command: [/bin/true]}\nzzz: 1\n")
    [line] = problems(path)
    assert line == (
        "f:3:1: error: zzz: unknown key 'zzz'; expected one of: cgroup, dashboard, defaults, "
        "metrics, processes, queues, redis, shutdown_grace, tracing"
    )


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: /bin/true\n")
    [line] = problems(path)
    assert line.startswith("f:3:14: error: queues.a.command: '/bin/true' is not valid here; ")
    assert "as a list" in line


def test_below_minimum_matches_the_contract_wording(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  email:\n    command: [/bin/true]\n    concurrency: 0\n")
    assert problems(path) == [
        "f:4:18: error: queues.email.concurrency: 0 is less than the minimum of 1"
    ]


def test_bad_duration_has_a_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [/bin/true]\n    timeout: 5 minutes\n")
    [line] = problems(path)
    assert line.startswith("f:4:14: error: queues.a.timeout: '5 minutes' is not valid here; ")
    assert "250ms, 30s, 5m, 2h, 1d" in line


def test_zero_timeout_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [/bin/true]\n    timeout: 0s\n")
    assert problems(path) == ["f:4:14: error: queues.a.timeout: must be longer than zero"]


def test_lease_renewal_must_be_well_below_reclaim(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a:\n    command: [/bin/true]\n"
        "    lease: {renew_every: 30s, reclaim_after: 1m}\n",
    )
    [line] = problems(path)
    assert line.startswith("f:4:26: error: queues.a.lease.renew_every: 30s is not well below")
    assert "set renew_every to 20s or less" in line


def test_dead_letter_stream_equal_to_source(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a:\n    stream: s\n    command: [/bin/true]\n    dead_letter: {stream: s}\n",
    )
    [line] = problems(path)
    assert line.startswith("f:5:27: error: queues.a.dead_letter.stream: the dead-letter stream")


def test_dead_letter_stream_of_another_queue(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a: {stream: s, command: [/bin/true]}\n"
        "  b: {command: [/bin/true], dead_letter: {stream: s}}\n",
    )
    [line] = problems(path)
    assert line.startswith("f:3:3: error: queues.b.dead_letter.stream: ")
    assert "stream of queue 'a'" in line


def test_two_queues_on_one_stream_and_group(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a: {stream: s, command: [/bin/true]}\n  b: {stream: s, command: [/bin/true]}\n",
    )
    [line] = problems(path)
    assert line.startswith(
        "f:3:3: error: queues.b: reads stream 's' with group 'jobd' like queue 'a'"
    )


# Every key jobd derives from queue a's stream 's' (priorities high, low: low reads 's'), as
# keys.py derives it, with what the message calls it.
A_WITH_LEVELS = "  a: {stream: s, command: [/bin/true], priorities: [high, low]}\n"
DERIVED_OF_A = [
    ("{s}:priority:high", "the stream of priority level 'high'"),
    ("{s}:priority:high:delayed", "the delayed set of priority level 'high'"),
    ("{s}:priority:high:trim", "the retention cursor of priority level 'high'"),
    ("{s}:delayed", "the delayed set"),
    ("{s}:trim", "the retention cursor"),
    ("{s}:running", "the cluster-wide slots"),
    ("{s}:rate", "the rate bucket"),
    ("{s}:waiting", "the waiting consumers"),
    ("{s}:paused", "the pause mark"),
    ("{s}:cancels", "the cancel marks"),
    ("{s}:cancels:gen", "the cancel generation"),
    ("{s}:history", "the job history"),
    ("{s}:history:at", "the history index"),
    ("{s}:active", "the running-job records"),
    ("{s}:events", "the events stream"),
    ("{s}:outbox", "the follow-ups outbox"),
    ("{s}:waiters", "the waiters (--after)"),
    ("{s}:held", "the held jobs (--after)"),
    ("{s}:after", "the held jobs' dependencies"),
    ("{s}:held:until", "the held jobs' deadlines"),
    ("{s}:held:ended", "the ended holds (--after)"),
    ("{s}:taken", "the taken workflow entries"),
    ("{s}:job:j1", "a job mark"),
    ("{s}:tick:nightly:1700000000", "a schedule's tick mark"),
    ("{s}:schedule:nightly", "a schedule's last tick"),
    ("{s}:timings:28333333", "a minute's timings"),
    ("{s}:stats:28333333", "a minute's counters"),
]


def test_the_collisions_checked_are_every_key_keys_py_derives() -> None:
    """A key added to keys.QueueKeys is a collision validate refuses, and is listed here."""
    from jobd.store.keys import QueueKeys

    exact = QueueKeys.of("s").derived(["high"]).exact
    families = ("{s}:job:", "{s}:tick:", "{s}:schedule:", "{s}:timings:", "{s}:stats:")
    assert set(exact) == {key for key, _ in DERIVED_OF_A if not key.startswith(families)}


@pytest.mark.parametrize(("key", "what"), DERIVED_OF_A)
def test_a_stream_that_is_a_key_derived_from_another_queues_stream(
    tmp_path: Path, key: str, what: str
) -> None:
    """Another queue's priority level stream: each queue would run the other's jobs; its
    delayed set, marks, records: one key used as two things."""
    path = write(
        tmp_path, f"queues:\n{A_WITH_LEVELS}  b: {{stream: '{key}', command: [/bin/true]}}\n"
    )
    [line] = problems(path)
    assert line.startswith(f"f:3:15: error: queues.b.stream: the stream '{key}' is {what}")
    assert line.endswith(
        "of queue 'a'; jobd would use that key for both queues: name another stream"
    )


@pytest.mark.parametrize(("key", "what"), DERIVED_OF_A)
def test_a_dead_letter_stream_that_is_a_key_derived_from_another_queues_stream(
    tmp_path: Path, key: str, what: str
) -> None:
    """A dead letter written into a level stream runs again, for ever; `jobd dlq purge`
    would delete a live level stream."""
    path = write(
        tmp_path,
        f"queues:\n{A_WITH_LEVELS}  b: {{command: [/bin/true], dead_letter: {{stream: '{key}'}}}}\n",
    )
    [line] = problems(path)
    assert line.startswith(
        f"f:3:51: error: queues.b.dead_letter.stream: the dead-letter stream '{key}' is {what}"
    )
    assert "of queue 'a'; dead letters" in line
    assert line.endswith("name another, e.g. '{jobd:b}:dead' (the default)")


@pytest.mark.parametrize(("key", "what"), DERIVED_OF_A)
def test_a_dead_letter_stream_that_is_a_key_derived_from_its_own_stream(
    tmp_path: Path, key: str, what: str
) -> None:
    path = write(
        tmp_path,
        "queues:\n  a: {stream: s, command: [/bin/true], priorities: [high, low],\n"
        f"      dead_letter: {{stream: '{key}'}}}}\n",
    )
    [line] = problems(path)
    assert line.startswith(
        f"f:3:29: error: queues.a.dead_letter.stream: the dead-letter stream '{key}' is {what}"
    )
    assert "of this queue; dead letters" in line


@pytest.mark.parametrize(
    ("stream", "key", "what"),
    [
        ("{a}:job", "{a}:job:delayed", "a job mark (--unique, dedupe)"),
        ("{a}:priority", "{a}:priority:dead", "the stream of priority level 'dead'"),
        ("{a}:schedule", "{a}:schedule:delayed", "a schedule's last tick"),
        ("{a}:tick", "{a}:tick:delayed", "a schedule's tick mark"),
    ],
)
def test_a_stream_whose_keys_are_another_queues_keys(
    tmp_path: Path, stream: str, key: str, what: str
) -> None:
    """Queue a's job marks are '{a}:job:ID'; b on stream '{a}:job' has its dead letters,
    history, events… on '{a}:job:dead', '{a}:job:history': a's marks of job ids 'dead',
    'history', which a job of a with that id overwrites (its 'done' mark, a SET, replaced
    b's dead-letter stream). Only b's stream was checked against a's keys, and a default
    dead-letter stream not at all; every key b derives is now."""
    path = write(
        tmp_path,
        "queues:\n  a: {stream: a, command: [/bin/true], dedupe: {window: 1h},"
        " priorities: [dead, low]}\n"
        f"  b: {{stream: '{stream}', command: [/bin/true]}}\n",
    )
    [line] = problems(path)
    assert line.startswith(
        f"f:3:15: error: queues.b.stream: from the stream '{stream}' jobd derives '{key}' "
    )
    assert f"which is {what} of queue 'a'; jobd would use that key for both queues" in line


def test_two_streams_from_which_the_same_keys_are_derived(tmp_path: Path) -> None:
    """'{s}' keeps its hash tag, 's' gets one: both derive '{s}:delayed', '{s}:history'…"""
    path = write(
        tmp_path,
        "queues:\n  a: {stream: s, command: [/bin/true]}\n"
        "  b: {stream: '{s}', command: [/bin/true], dead_letter: {stream: bd}}\n",
    )
    [line] = problems(path)
    assert line.startswith(
        "f:3:15: error: queues.b.stream: from the stream '{s}' jobd derives the same keys "
        "(e.g. '{s}:delayed') as from queue 'a''s stream 's'"
    )


def test_keys_derived_from_a_stream_that_are_no_others_are_fine(tmp_path: Path) -> None:
    """The default level reads the queue's stream: '{s}:priority:low' is nobody's; a queue
    on the same stream with another group shares every key, by design."""
    path = write(
        tmp_path,
        f"queues:\n{A_WITH_LEVELS}"
        "  b: {stream: s, group: g2, command: [/bin/true], priorities: [high, low]}\n"
        "  c: {stream: '{s}:priority:low', command: [/bin/true]}\n"
        "  d: {stream: '{s}:other', command: [/bin/true], dead_letter: {stream: '{s}:dead2'}}\n",
    )
    assert set(load(str(path)).queues) == {"a", "b", "c", "d"}


def test_same_stream_with_another_group_is_fine(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a: {stream: s, command: [/bin/true]}\n"
        "  b: {stream: s, group: g2, command: [/bin/true]}\n",
    )
    assert set(load(str(path)).queues) == {"a", "b"}


def test_command_missing(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [./nope.sh, x]\n")
    assert problems(path) == [
        f"f:3:15: error: queues.a.command.0: '{tmp_path}/nope.sh' does not exist"
    ]


def test_command_not_executable(tmp_path: Path) -> None:
    (tmp_path / "h.sh").write_text("#!/bin/sh\n")
    path = write(tmp_path, "queues:\n  a:\n    command: [./h.sh]\n")
    [line] = problems(path)
    assert line.startswith(
        f"f:3:15: error: queues.a.command.0: '{tmp_path}/h.sh' is not executable"
    )
    assert "chmod +x" in line


def test_command_not_on_path(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    command: [no-such-program-jobd]\n")
    [line] = problems(path)
    assert line.startswith("f:3:15: error: queues.a.command.0: 'no-such-program-jobd' is not found")


def test_command_required_here_or_in_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a:\n    concurrency: 2\n")
    assert problems(path) == [
        "f:2:3: error: queues.a: 'command' is required; set it here or in defaults"
    ]


def test_unset_environment_variable(tmp_path: Path) -> None:
    path = write(
        tmp_path, "redis:\n  url: ${JOBD_TEST_UNSET}\nqueues:\n  a: {command: [/bin/true]}\n"
    )
    [line] = problems(path, {"PATH": "/bin"})
    assert line.startswith(
        "f:2:8: error: redis.url: environment variable JOBD_TEST_UNSET is not set"
    )


def test_error_in_defaults_points_at_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a: {command: [/bin/true]}\ndefaults:\n  lease:\n    renew_every: 1m\n",
    )
    [line] = problems(path)
    assert line.startswith("f:5:18: error: queues.a.lease.renew_every: 1m is not well below")
    assert line.endswith("(value set in defaults)")


def test_every_problem_at_once_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n"
        "  b:\n    command: [./missing.sh]\n"
        "  a:\n    command: [/bin/true]\n    concurrency: -1\n    retry: {max_atempts: 3}\n"
        "shutdown_grace: soon\n",
    )
    found = problems(path)
    assert [line.split(": error")[0] for line in found] == ["f:3:15", "f:6:18", "f:7:13", "f:8:17"]


def test_duplicate_keys_are_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a: {command: [/bin/true]}\n  a: {command: [/bin/false]}\n")
    [line] = problems(path)
    assert line.startswith("f:3:3: error: duplicate key 'queues.a'")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "f:1:1: error: the file is empty"),
        ("- a\n- b\n", "f:1:1: error: the top level must be a mapping"),
        ("42\n", "f:1:1: error: the top level must be a mapping"),
        ("redis: {}\n", "f:1:1: error: 'queues' is a required property"),
        (
            "queues: {}\n",
            "f:1:9: error: queues: {} should be non-empty; declare at least one queue",
        ),
    ],
)
def test_documents_that_are_not_configs(tmp_path: Path, text: str, expected: str) -> None:
    [line] = problems(write(tmp_path, text))
    assert line.startswith(expected)


def test_unreadable_files_get_one_line(tmp_path: Path) -> None:
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\x7fELF\x00\x01\x02")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"queues:\n  caf\xe9: {command: [/bin/true]}\n")
    assert problems(binary) == ["f: error: is a binary file, not a YAML config"]
    assert problems(latin1)[0].startswith("f: error: is not UTF-8 text")
    assert problems(tmp_path) == ["f: error: is a directory, not a config file"]
    assert problems(tmp_path / "absent.yaml") == [
        "f: error: cannot read the file: No such file or directory"
    ]


# -- the typed result ---------------------------------------------------------------------------


def test_defaults_merge_into_each_queue_key_by_key(tmp_path: Path, true_handler: Path) -> None:
    path = write(
        tmp_path,
        "defaults:\n"
        "  command: [./ok.sh]\n  concurrency: 4\n"
        "  lease: {renew_every: 5s}\n  env: {A: '1', B: '2'}\n"
        "queues:\n"
        "  a: {}\n"
        "  b:\n    concurrency: 2\n    lease: {reclaim_after: 2m}\n    env: {B: three}\n",
    )
    config = load(str(path), {"PATH": "/usr/bin:/bin"})
    a, b = config.queues["a"], config.queues["b"]
    assert a.command == (str(true_handler),)
    assert (a.concurrency, b.concurrency) == (4, 2)
    assert (a.lease.renew_every, a.lease.reclaim_after) == (5, 60)
    assert (b.lease.renew_every, b.lease.reclaim_after) == (5, 120)
    assert (a.env["A"], a.env["B"], b.env["B"]) == ("1", "2", "three")


def test_built_in_defaults(tmp_path: Path) -> None:
    config = load(str(write(tmp_path, "queues:\n  mail: {command: [/bin/true]}\n")))
    q = config.queues["mail"]
    assert (q.stream, q.group, q.concurrency) == ("jobd:mail", "jobd", 1)
    assert (q.timeout, q.kill_grace, q.lease.renew_every, q.lease.reclaim_after) == (
        1800,
        10,
        10,
        60,
    )
    assert q.dead_letter.stream == "{jobd:mail}:dead"
    assert q.fail_exit_codes == {64, 65}
    assert q.cwd == str(tmp_path)
    assert config.shutdown_grace == 30
    assert config.redis.url == f"unix://{tmp_path}/.jobd/redis.sock", "an embedded Redis"
    assert config.redis.embedded is not None and config.redis.embedded.appendfsync == "everysec"


def test_environment_expansion_and_retyping(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "redis: {url: 'redis://${HOST:-localhost}:${PORT}/0'}\n"
        "queues:\n  a:\n    command: [/bin/true]\n    concurrency: ${CONC:-3}\n"
        "    env: {LITERAL: 'cost $$5'}\n",
    )
    config = load(str(path), {"PORT": "6400", "PATH": "/bin"})
    assert config.redis.url == "redis://localhost:6400/0"
    assert config.queues["a"].concurrency == 3
    assert config.queues["a"].env["LITERAL"] == "cost $5"


def test_relative_paths_resolve_against_the_config_folder(
    tmp_path: Path, true_handler: Path
) -> None:
    (tmp_path / "work").mkdir()
    write(tmp_path, "queues:\n  a: {command: [./ok.sh, ./arg], cwd: work}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    old = os.getcwd()
    os.chdir(elsewhere)
    try:
        q = load("../jobd.yaml").queues["a"]
    finally:
        os.chdir(old)
    assert q.command == (str(true_handler), "./arg")  # only the program is a path of ours
    assert q.cwd == str(tmp_path / "work")


def test_config_is_immutable(tmp_path: Path) -> None:
    config = load(str(write(tmp_path, "queues:\n  a: {command: [/bin/true], env: {X: y}}\n")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.queues["a"].concurrency = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.queues["a"].env["X"] = "z"  # type: ignore[index]
    with pytest.raises(TypeError):
        config.queues["b"] = config.queues["a"]  # type: ignore[index]


def test_handler_environment_is_a_small_base(tmp_path: Path) -> None:
    path = write(tmp_path, "queues:\n  a: {command: [/bin/true], env: {MINE: 'yes'}}\n")
    environ = {
        "PATH": "/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_TIME": "C",
        "TZ": "UTC",
        "REDIS_PASSWORD": "s3cret",
        "AWS_SECRET_ACCESS_KEY": "k",
        "NOTIFY_SOCKET": "/x",
    }
    env = dict(load(str(path), environ).queues["a"].env)
    assert env == {
        "PATH": "/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LC_TIME": "C",
        "TZ": "UTC",
        "MINE": "yes",
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30),
        ("5m", 300),
        ("2h", 7200),
        ("1d", 86400),
        ("1.5s", 1.5),
        (12, 12),
        (0.5, 0.5),
        ("45", 45),
    ],
)
def test_durations(text: str | float, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize("bad", ["", "5x", "-1s", "1 m s", "ms", True, -3])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="250ms, 30s"):
        durations.parse(bad)  # type: ignore[arg-type]


# -- where Redis is: one server, a cluster, a Sentinel group -------------------------------------


def test_cluster_and_sentinel_configs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "redis:\n  cluster:\n    nodes: [10.0.0.1:7000, 'r2.example:7001', '[::1]:7002']\n"
        "  password: pw\nqueues:\n  a: {command: [/bin/true]}\n",
    )
    redis = load(str(path), {}).redis
    assert redis.cluster == (("10.0.0.1", 7000), ("r2.example", 7001), ("::1", 7002))
    assert redis.describe() == "Redis Cluster via 10.0.0.1:7000, r2.example:7001, [::1]:7002"
    assert "pw" not in repr(redis)
    (tmp_path / "spw").write_text("sentinel-secret\n")
    path = write(
        tmp_path,
        "redis:\n  sentinel:\n    master: jobs\n    nodes: ['h1:26379', 'h2:26379']\n"
        "    db: 2\n    password_file: spw\nqueues:\n  a: {command: [/bin/true]}\n",
    )
    redis = load(str(path), {}).redis
    assert redis.sentinel is not None and redis.sentinel.master == "jobs"
    assert redis.sentinel.nodes == (("h1", 26379), ("h2", 26379)) and redis.sentinel.db == 2
    assert redis.sentinel.password == "sentinel-secret"
    assert "sentinel-secret" not in repr(redis)
    assert redis.describe() == "master 'jobs' of Sentinel h1:26379, h2:26379"


@pytest.mark.parametrize(
    ("redis", "expected"),
    [
        (
            "  url: redis://x\n  cluster: {nodes: ['a:1']}\n",
            "f:3:12: error: redis.cluster: give one of redis.url, redis.cluster, not several",
        ),
        (
            "  cluster: {nodes: [a]}\n",
            "f:2:21: error: redis.cluster.nodes.0: 'a' is not valid here; write HOST:PORT, "
            "e.g. 10.0.0.5:6379 or [::1]:6379",
        ),
        (
            "  sentinel: {nodes: ['h:26379']}\n",
            "f:2:3: error: redis.sentinel: 'master' is a required property",
        ),
        (
            "  cluster: {nodes: ['a:1']}\n  tls: {ca_file: ca.pem}\n",
            "f:3:8: error: redis.tls: TLS is supported with redis.url (rediss://) only, not yet "
            "with a cluster or Sentinel; reach those over a private network or a TLS tunnel",
        ),
    ],
)
def test_bad_cluster_and_sentinel_settings(tmp_path: Path, redis: str, expected: str) -> None:
    path = write(tmp_path, "redis:\n" + redis + "queues:\n  a: {command: [/bin/true]}\n")
    assert problems(path) == [expected]


def test_on_a_cluster_a_dead_letter_stream_must_share_its_queues_slot(tmp_path: Path) -> None:
    queues = (
        "queues:\n"
        "  a: {command: [/bin/true], stream: 'media:a', dead_letter: {stream: 'media:a:dead'}}\n"
        "  b: {command: [/bin/true], stream: '{m}:b', dead_letter: {stream: '{m}:dead'}}\n"
        "  c: {command: [/bin/true], stream: 'media:c'}\n"
        "  d: {command: [/bin/true], stream: 'odd}name'}\n"
    )
    path = write(tmp_path, "redis: {cluster: {nodes: ['h:7000']}}\n" + queues)
    assert problems(path) == [
        "f:3:70: error: queues.a.dead_letter.stream: the dead-letter stream 'media:a:dead' is in "
        "another Redis Cluster slot than the stream 'media:a'; one script writes both: name it "
        "'{media:a}:dead' (the default) or give both one hash tag",
        "f:6:37: error: queues.d.stream: the stream 'odd}name' has a '}' but no {hash tag}, so "
        "its other keys cannot share its Redis Cluster slot: give it a hash tag, e.g. '{oddname}'",
    ]
    # One server has no slots: the same queues are fine there.
    load(str(write(tmp_path, "redis: {url: 'redis://h'}\n" + queues)), {})


# -- scheduling controls -----------------------------------------------------------------------


def test_scheduling_controls_are_parsed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "queues:\n  a:\n    command: [/bin/true]\n"
        "    limits: {concurrency: 4, rate: 100/1m}\n"
        "    dedupe: {window: 1h}\n"
        "    priorities: [high, low]\n"
        "    schedule:\n"
        "      - {cron: '*/5 * * * *', payload: {a: 1}, timezone: Europe/Berlin}\n"
        "      - {cron: '* * * * * */10', payload: ping, name: heartbeat, catch_up: 5m}\n",
    )
    q = load(str(path), {}).queues["a"]
    assert q.slots == 4 and (q.rate.count, q.rate.per, q.rate.burst) == (100, 60.0, 100)
    assert q.dedupe_window == 3600
    assert [(lv.priority, lv.stream) for lv in q.all_levels()] == [
        ("high", "{jobd:a}:priority:high"),
        ("low", "jobd:a"),
    ]
    first, heartbeat = q.schedule
    assert first.payload == b'{"a":1}' and first.timezone == "Europe/Berlin"
    assert first.name.startswith("cron-") and first.catch_up == 60
    assert (heartbeat.name, heartbeat.payload, heartbeat.catch_up) == ("heartbeat", b"ping", 300)


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        (
            "limits: {rate: 100 per minute}",
            "f:4:20: error: queues.a.limits.rate: '100 per minute' is not valid here; write "
            "COUNT/DURATION, e.g. 100/1m or 20/1s",
        ),
        (
            "priorities: [high, low]\n    default_priority: medium",
            "f:5:23: error: queues.a.default_priority: 'medium' is not one of the queue's "
            "priorities (high, low)",
        ),
        ("priorities: [high]", "f:4:17: error: queues.a.priorities: ['high'] is too short"),
        ("dedupe: {window: 0}", "f:4:22: error: queues.a.dedupe.window: must be longer than zero"),
        (
            "schedule: [{cron: 'every day'}]",
            "f:4:23: error: queues.a.schedule.0.cron: 'every day' is not a cron expression: "
            "write five fields (minute hour day month weekday), or six with seconds last, e.g. "
            "'*/5 * * * *'",
        ),
        (
            "schedule: [{cron: '* * * * *', timezone: Mars/Olympus}]",
            "f:4:46: error: queues.a.schedule.0.timezone: no time zone 'Mars/Olympus'; write an "
            "IANA name such as UTC or Europe/Berlin",
        ),
        (
            "schedule: [{cron: '* * * * *', name: x}, {cron: '*/2 * * * *', name: x}]",
            "f:4:46: error: queues.a.schedule.1: a second schedule named 'x' (same name, or the "
            "same cron, time zone and payload): each tick would be enqueued once for both; give "
            "it a name",
        ),
    ],
)
def test_bad_scheduling_controls(tmp_path: Path, queue: str, expected: str) -> None:
    path = write(tmp_path, f"queues:\n  a:\n    command: [/bin/true]\n    {queue}\n")
    assert problems(path) == [expected]


# -- max_wait (issue 19) -----------------------------------------------------------------------


def test_max_wait_is_an_optional_duration(tmp_path: Path) -> None:
    path = write(tmp_path, "defaults: {max_wait: 90s}\nqueues:\n  a: {command: [/bin/true]}\n")
    assert load(str(path), {}).queues["a"].max_wait == 90
    path = write(tmp_path, "queues:\n  a: {command: [/bin/true]}\n")
    assert load(str(path), {}).queues["a"].max_wait is None, "default: no max_wait"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0s", "f:4:15: error: queues.a.max_wait: must be longer than zero"),
        ("soon", "f:4:15: error: queues.a.max_wait: 'soon' is not valid here; "),
        ("-5s", "f:4:15: error: queues.a.max_wait: '-5s' is not valid here; "),
    ],
)
def test_bad_max_wait(tmp_path: Path, value: str, expected: str) -> None:
    path = write(tmp_path, f"queues:\n  a:\n    command: [/bin/true]\n    max_wait: {value}\n")
    [line] = problems(path)
    assert line.startswith(expected)
