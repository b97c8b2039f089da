"""Least privilege in the config (issue 17): no message shows a secret, env values and secrets
are the text written, ${VAR} never injects YAML, and run_as never leaves handlers as root."""

from __future__ import annotations

import grp
import json
import logging
import os
from pathlib import Path

import pytest

from jobd.cli import main as cli
from jobd.config import Config, ConfigError, RedisConfig, load, yamlsrc

SECRET = "S3cr3t-hunter2"
QUEUE = "queues:\n  a:\n    command: [/bin/true]\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobd.yaml"
    path.write_text(text)
    return path


def config_error(path: Path, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(str(path), {"PATH": os.environ["PATH"], **(environ or {})})
    return info.value


def problems(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    return [p.format("f") for p in config_error(path, environ).problems]


def loaded(path: Path, environ: dict[str, str] | None = None) -> Config:
    return load(str(path), {"PATH": os.environ["PATH"], **(environ or {})})


def validate_output(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What `jobd validate` prints, text and JSON, with SECRET in the environment."""
    os.environ["JOBD_TEST_SECRET"] = SECRET
    try:
        cli.main(["validate", str(path), *args])
    finally:
        del os.environ["JOBD_TEST_SECRET"]
    out = capsys.readouterr()
    return out.out + out.err


# -- (4) no message shows a secret --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        (
            "redis:\n  url: ${U}\n" + QUEUE,
            {"U": f"http://jobd:{SECRET}@redis.internal:6379/0"},
            "f:2:8: error: redis.url: is not valid here; write a URL such as "
            "redis://127.0.0.1:6379/0, rediss://host:6380/0 or unix:///run/redis.sock "
            "(the value is not shown: it may be a secret)",
        ),
        (
            "redis:\n  url: ${U}\n" + QUEUE,
            {"U": f"redis.internal/0?password={SECRET}"},
            "f:2:8: error: redis.url: is not valid here; write a URL such as "
            "redis://127.0.0.1:6379/0, rediss://host:6380/0 or unix:///run/redis.sock "
            "(the value is not shown: it may be a secret)",
        ),
        (
            "dashboard:\n  token: ${T}\n" + QUEUE,
            {"T": SECRET[:10]},
            "f:2:10: error: dashboard.token: must be at least 16 characters long "
            "(the value is not shown: it may be a secret)",
        ),
        (
            f"redis:\n  password: [{SECRET}]\n" + QUEUE,
            {},
            "f:2:13: error: redis.password: must be a string, not a list "
            "(the value is not shown: it may be a secret)",
        ),
        (
            f"redis:\n  sentinel:\n    master: m\n    nodes: ['h:1']\n    password: {{x: {SECRET}}}\n"
            + QUEUE,
            {},
            "f:5:15: error: redis.sentinel.password: must be a string, not a mapping "
            "(the value is not shown: it may be a secret)",
        ),
        (
            f"redis: redis://jobd:{SECRET}@h:6379/0\n" + QUEUE,
            {},
            "f:1:8: error: redis: must be a mapping, not a string "
            "(the value is not shown: it may be a secret)",
        ),
        (
            f"redis:\n  - password: {SECRET}\n" + QUEUE,
            {},
            "f:2:3: error: redis: must be a mapping, not a list "
            "(the value is not shown: it may be a secret)",
        ),
        (
            QUEUE + f"    env: {{API_KEY: [{SECRET}]}}\n",
            {},
            "f:4:20: error: queues.a.env.API_KEY: must be a string, not a list "
            "(the value is not shown: it may be a secret)",
        ),
        (
            f"{SECRET}\n",
            {},
            "f:1:1: error: the top level must be a mapping with a 'queues:' key, not a string",
        ),
    ],
)
def test_schema_problems_never_show_a_secret(
    tmp_path: Path, text: str, environ: dict[str, str], expected: str
) -> None:
    error = config_error(write(tmp_path, text), environ)
    assert [p.format("f") for p in error.problems] == [expected]
    shown = json.dumps([p.as_json() for p in error.problems]) + str(error)
    assert SECRET not in shown and SECRET[:10] not in shown


def test_validate_and_its_json_never_show_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "redis:\n  url: 'http://h/0?password=${JOBD_TEST_SECRET}'\n"
        "dashboard:\n  token: ${JOBD_TEST_SECRET}\n" + QUEUE,
    )
    for args in ((), ("--format", "json")):
        shown = validate_output(path, capsys, *args)
        assert "redis.url" in shown and "dashboard.token" in shown
        assert SECRET not in shown


def test_a_problem_never_quotes_a_urls_credentials(tmp_path: Path) -> None:
    """Defence in depth: a URL quoted in any message (here a misplaced one) is redacted too."""
    path = write(tmp_path, QUEUE + f"    schedule: [{{cron: 'https://me:{SECRET}@host/x'}}]\n")
    [line] = problems(path)
    assert SECRET not in line and "https://me:***@host/x" in line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://jobd:{SECRET}@h:6379/0", "redis://jobd:***@h:6379/0"),
        (f"rediss://:{SECRET}@h:6380/0", "rediss://:***@h:6380/0"),
        (f"redis://h:6379/0?password={SECRET}", "redis://h:6379/0?password=***"),
        (
            f"redis://h/0?db=1&password={SECRET}&socket_timeout=5",
            "redis://h/0?db=1&password=***&socket_timeout=5",
        ),
        (f"redis://h/0?pass%77ord={SECRET}", "redis://h/0?pass%77ord=***"),
        (f"redis://jobd:x@h/0?password={SECRET}", "redis://jobd:***@h/0?password=***"),
        (f"redis://{SECRET}@h/0", "redis://***@h/0"),  # a userinfo without ':' may be a token
        (
            f"unix:///run/redis.sock?db=0&password={SECRET}",
            "unix:///run/redis.sock?db=0&password=***",
        ),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_describe_and_repr_mask_url_credentials(tmp_path: Path, url: str, shown: str) -> None:
    config = loaded(write(tmp_path, "redis:\n  url: ${U}\n" + QUEUE), {"U": url})
    assert config.redis.url == url, "the URL itself is unchanged"
    assert config.redis.describe() == shown
    assert SECRET not in repr(config) and SECRET not in config.redis.redacted_url()


@pytest.mark.parametrize(
    "url",
    [
        f"redis://jobd:pa/{SECRET}@h:6379/0",  # redis-py: "Port could not be cast ... as 'pa'"
        f"redis://:p#{SECRET}@h/0",
        f"redis://:12/{SECRET}@h/0",  # port 12, db "{SECRET}@h/0"
        f"redis://:1?{SECRET}@h/0",
        "redis://h:63x79/0",
    ],
)
def test_a_url_that_does_not_read_as_written_is_refused_unshown(tmp_path: Path, url: str) -> None:
    path = write(tmp_path, "redis:\n  url: ${U}\n" + QUEUE)
    assert problems(path, {"U": url}) == [
        "f:2:8: error: redis.url: cannot be read as written: its port is not a number, or its "
        "user name or password holds '/', '?', '#' or '@', which must be percent-encoded there "
        "(%2F, %3F, %23, %40) (the value is not shown: it may be a secret)"
    ]


def test_a_percent_encoded_password_reads(tmp_path: Path) -> None:
    path = write(tmp_path, "redis:\n  url: ${U}\n" + QUEUE)
    config = loaded(path, {"U": f"redis://jobd:pa%2F{SECRET}%40@[::1]:6379/0?db=1"})
    assert config.redis.describe() == "redis://jobd:***@[::1]:6379/0?db=1"


def test_describe_masks_all_of_a_userinfo_that_does_not_parse() -> None:
    """Such a URL is refused by load(); a RedisConfig built otherwise still hides it."""
    broken = RedisConfig(url=f"redis://jobd:{SECRET[:5]}/{SECRET[5:]}@y@h/0")
    assert broken.describe() == "redis://jobd:***@h/0"
    assert SECRET[:5] not in repr(broken) and SECRET[5:] not in repr(broken)


def test_summary_and_repr_never_show_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pw").write_text(SECRET + "-file\n")
    (tmp_path / "token").write_text(SECRET + "-token-file\n")
    path = write(
        tmp_path,
        "redis:\n  url: 'redis://h/0?password=${JOBD_TEST_SECRET}'\n  password_file: pw\n"
        "dashboard:\n  token_file: token\n  actions: true\n"
        + QUEUE
        + "    env: {API_KEY: '${JOBD_TEST_SECRET}'}\n",
    )
    for args in ((), ("--format", "json")):
        shown = validate_output(path, capsys, *args)
        assert "redis://h/0?password=***" in shown and SECRET not in shown
    config = loaded(path, {"JOBD_TEST_SECRET": SECRET})
    assert config.redis.password == SECRET + "-file"
    assert config.dashboard.token == SECRET + "-token-file"
    assert config.queues["a"].env["API_KEY"] == SECRET
    assert SECRET not in repr(config) and SECRET not in str(config)


# A YAML syntax error's excerpt shows a line's text up to its first ':' only (review 4 of
# issue 32): a secret sits after a key of any name, in a flow mapping or a handler's env.
@pytest.mark.parametrize(
    "text",
    [
        # A flow mapping on the redis line: the key the excerpt checked was 'redis'.
        f"redis: {{password: {SECRET}]\nqueues: {{q: {{command: [/bin/cat]}}}}\n",
        # A tab in front of a handler's environment variable: its value is 'never shown'.
        f"queues:\n  q:\n    command: [/bin/cat]\n    env:\n\tSTRIPE: {SECRET}\n",
        # A value holding ': ' unquoted, on an env line whose name says nothing of a secret.
        f"queues:\n  q:\n    command: [/bin/cat]\n    env:\n      STRIPE: {SECRET}: x\n",
        # A list item: no key, nothing of the line is shown.
        f"queues:\n  q:\n    command:\n      - /bin/cat\n     - {SECRET}\n",
    ],
    ids=["redis-flow-mapping", "env-tab", "env-colon", "list-item"],
)
def test_a_yaml_syntax_errors_excerpt_never_shows_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = write(tmp_path, text)
    for args in (["validate", str(path)], ["status", "-c", str(path)]):
        assert cli.main(args) == 78
        out = capsys.readouterr()
        said = out.out + out.err
        assert "YAML syntax error" in said and " | " in said and "^" in said, said
        assert SECRET not in said, said


def test_a_yaml_syntax_errors_excerpt_keeps_the_key_and_the_caret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path, f"queues:\n  q:\n    command: [/bin/cat]\n    env:\n\tSTRIPE: {SECRET}\n"
    )
    assert cli.main(["validate", str(path)]) == 78
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{path}:5:1: error: YAML syntax error: "), lines
    assert lines[1:] == ["  5 | \\x09STRIPE: (not shown: it may be a secret)", "    | ^"]


# A mapping or list used as a key (review 4 of issue 32): its kind is named, never the key.
@pytest.mark.parametrize(
    "text",
    [
        # Braces doubled, as a template's escaping leaves them: the mapping becomes a key.
        f"redis: {{{{url: 'redis://h:6379/0', password: {SECRET}}}}}\n"
        "queues: {q: {command: [/bin/cat]}}\n",
        # A handler's environment with a list where a name belongs.
        f"queues: {{q: {{command: [/bin/cat], env: {{[{SECRET}]: x}}}}}}\n",
    ],
    ids=["redis-doubled-braces", "env-list-key"],
)
def test_a_key_that_is_no_string_is_not_quoted_with_the_secret_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = write(tmp_path, text)
    for args in ((), ("--format", "json")):
        shown = validate_output(path, capsys, *args)
        assert "keys must be strings, not a " in shown and SECRET not in shown, shown


def test_a_reload_refused_for_a_key_that_is_no_string_does_not_log_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon's reload says what `jobd validate` says: the key's kind, never the key."""
    from jobd.daemon.queues import reloaded

    path = write(tmp_path, QUEUE)
    config = loaded(path)
    path.write_text(f"queues: {{a: {{command: [/bin/true], env: {{[{SECRET}]: x}}}}}}\n")
    daemon = logging.getLogger("jobd.daemon")
    daemon.addHandler(caplog.handler)  # the daemon's logger may not propagate (logs.setup)
    try:
        assert reloaded(config)[0] is None
    finally:
        daemon.removeHandler(caplog.handler)
    assert "keys must be strings, not a list; quote the key" in caplog.text, caplog.text
    assert SECRET not in caplog.text


def test_the_path_check_does_not_echo_a_handlers_env_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """env values are 'never shown in messages' (schema.json): env.PATH is one; the PATH jobd
    gives a handler that sets none may be shown."""
    path = write(
        tmp_path, f"queues:\n  q:\n    command: [handler]\n    env: {{PATH: '/opt/{SECRET}/bin'}}\n"
    )
    for args in ((), ("--format", "json")):
        shown = validate_output(path, capsys, *args)
        assert "not found on the handler's PATH (the queue's env.PATH)" in shown, shown
        assert SECRET not in shown
    path.write_text("queues:\n  q:\n    command: [no-such-handler-anywhere]\n")
    shown = validate_output(path, capsys)
    assert f"not found on the handler's PATH ({os.environ['PATH']})" in shown, shown


# -- (5) env values and secrets are the text written --------------------------------------------

TEXTS = ["0755", "0x1F2e", "off", "yes", "1e3", "007", "~", "null", "", "918273645501", "1_000"]


@pytest.mark.parametrize("value", TEXTS)
def test_env_values_are_exactly_the_expanded_text(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, QUEUE + "    env:\n      PLAIN: ${V}\n      QUOTED: '${V}'\n")
    env = loaded(path, {"V": value}).queues["a"].env
    assert (env["PLAIN"], env["QUOTED"]) == (value, value)


@pytest.mark.parametrize(
    ("written", "text"),
    [*((v, v) for v in TEXTS if v), ('""', ""), ("", ""), ("'0755'", "0755"), ("!!int 12", "12")],
)
def test_env_values_are_exactly_the_text_written(tmp_path: Path, written: str, text: str) -> None:
    path = write(tmp_path, QUEUE + f"    env:\n      X: {written}\n")
    assert loaded(path).queues["a"].env["X"] == text


def test_env_values_in_defaults_are_text_too(tmp_path: Path) -> None:
    path = write(
        tmp_path, "defaults:\n  env:\n    MODE: 0755\n    DEBUG: off\n    N: ${V}\n" + QUEUE
    )
    env = loaded(path, {"V": "0x1F2e"}).queues["a"].env
    assert (env["MODE"], env["DEBUG"], env["N"]) == ("0755", "off", "0x1F2e")


@pytest.mark.parametrize("value", TEXTS)
def test_secrets_are_exactly_the_expanded_text(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path,
        "redis:\n  url: redis://h/0\n  password: ${V}\ndashboard:\n  token: ${T}\n" + QUEUE,
    )
    token = value.ljust(16, "0")  # 0755000000000000 reads as a YAML number too
    config = loaded(path, {"V": value, "T": token})
    assert (config.redis.password, config.dashboard.token) == (value, token)


@pytest.mark.parametrize("value", [v for v in TEXTS if v] + ["1234567890123456"])
def test_secrets_are_exactly_the_text_written(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path,
        f"redis:\n  url: redis://h/0\n  password: {value}\n"
        f"dashboard:\n  token: {value * 16}\n" + QUEUE,
    )
    config = loaded(path)
    assert (config.redis.password, config.dashboard.token) == (value, value * 16)


def test_other_text_keys_are_the_text_written(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "redis: {embedded: {appendfsync: no}}\n"
        "queues:\n  a: {command: [/bin/echo, --size, 256, off], stream: 2024, group: 007}\n",
    )
    config = loaded(path)
    assert config.redis.embedded is not None and config.redis.embedded.appendfsync == "no"
    q = config.queues["a"]
    assert (q.command, q.stream, q.group) == (("/bin/echo", "--size", "256", "off"), "2024", "007")


def test_typed_keys_still_take_the_type_an_unquoted_variable_spells(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "dashboard:\n  show_payloads: ${S}\n"
        + QUEUE
        + "    concurrency: ${C}\n    timeout: ${T}\n    retry:\n      jitter: ${J}\n",
    )
    config = loaded(path, {"S": "yes", "C": "8", "T": "90", "J": "0.5"})
    q = config.queues["a"]
    assert config.dashboard.show_payloads is True
    assert (q.concurrency, q.timeout, q.retry.jitter) == (8, 90.0, 0.5)


# -- ${VAR} holding YAML syntax is text, never structure ----------------------------------------

YAMLISH = [
    "pa: ss",
    "#secret",
    "pass # word",
    "{a: 1}",
    "[1, 2]",
    "- a",
    "&a *b",
    "!!int 5",
    "'quoted'",
    '"dq"',
    "a\nb: c",
    "|\n  block",
    "--- x",
    "${NOT_EXPANDED_TWICE}",
]


@pytest.mark.parametrize("value", YAMLISH)
def test_a_variable_with_yaml_syntax_is_taken_literally(tmp_path: Path, value: str) -> None:
    path = write(
        tmp_path,
        "redis:\n  url: redis://h/0\n  password: ${P}\n" + QUEUE + "    env: {X: '${P}'}\n",
    )
    config = loaded(path, {"P": value})
    assert config.redis.password == value
    assert config.queues["a"].env["X"] == value


@pytest.mark.parametrize("value", ["3 # 8", "{3: 1}", "[3]", "&a 3", "3\n# x"])
def test_a_typed_key_never_reads_yaml_structure_from_a_variable(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, QUEUE + "    concurrency: ${C}\n")
    [line] = problems(path, {"C": value})
    assert line.startswith("f:4:18: error: queues.a.concurrency: ")
    assert "is not of type 'integer'" in line


@pytest.mark.parametrize(
    ("line", "environ", "kind"),
    [
        ("concurrency: !!int abc", {}, "int"),
        ("concurrency: !!int", {}, "int"),
        ("concurrency: 0x_", {}, "int"),
        ("concurrency: ${C}", {"C": "0x_"}, "int"),
        ("concurrency: !!bool maybe", {}, "bool"),
    ],
)
def test_a_value_unfit_for_its_form_is_a_config_error(
    tmp_path: Path, line: str, environ: dict[str, str], kind: str
) -> None:
    assert problems(write(tmp_path, QUEUE + f"    {line}\n"), environ) == [
        f"f:4:18: error: the value is not a valid {kind} (as its tag or its form says it is); "
        "fix it, or quote it to make it a string"
    ]


# -- (8) run_as needs a user --------------------------------------------------------------------

GROUP = grp.getgrgid(os.getgid()).gr_name
GROUP_ALONE = (
    "a group alone would leave handlers running as root, with every capability; name the user "
    "they run as too, e.g. run_as: {user: jobs, group: media}"
)


def test_run_as_with_a_group_alone_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, QUEUE + f"    run_as: {{group: {GROUP}}}\n")
    assert f"f:4:13: error: queues.a.run_as: {GROUP_ALONE}" in problems(path)


def test_run_as_with_a_group_alone_in_defaults_is_refused_there(tmp_path: Path) -> None:
    path = write(tmp_path, f"defaults:\n  run_as: {{group: {GROUP}}}\n" + QUEUE)
    expected = f"f:2:11: error: queues.a.run_as: {GROUP_ALONE} (value set in defaults)"
    assert expected in problems(path)


def test_run_as_user_from_defaults_and_group_from_the_queue_is_fine(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "defaults:\n  run_as: {user: nobody}\n" + QUEUE + f"    run_as: {{group: {GROUP}}}\n",
    )
    try:
        q = loaded(path).queues["a"]
    except ConfigError as exc:  # not root: switching users is refused, for another reason
        assert not [p for p in exc.problems if "group alone" in p.message]
    else:
        assert (q.run_as_user, q.run_as_group) == ("nobody", GROUP)


@pytest.mark.parametrize("value", ["*Hunter2secret", "&Hunter2secret x", "!Hunter2secret x"])
def test_a_yaml_error_does_not_quote_what_was_written(tmp_path: Path, value: str) -> None:
    """`password: *Hunter2secret` is an undefined YAML alias; the error used to quote it
    ("found undefined alias 'Hunter2secret'"), in validate and the reload log alike."""
    path = tmp_path / "jobd.yaml"
    path.write_text(f"redis:\n  url: redis://h:6379/0\n  password: {value}\nqueues: {{}}\n")
    with pytest.raises(ConfigError) as caught:
        load(str(path))
    text = "\n".join(p.format(str(path)) for p in caught.value.problems)
    assert "Hunter2" not in text and text, text


def _laughs(levels: int = 8) -> str:
    """Each level an anchor of ten aliases of the one before: 10 ** (levels + 1) values."""
    lines = ["a: &a [x,x,x,x,x,x,x,x,x,x]"]
    for i in range(1, levels + 1):
        before = "a" if i == 1 else f"l{i - 1}"
        lines.append(f"l{i}: &l{i} [{','.join([f'*{before}'] * 10)}]")
    return "\n".join(lines) + "\n"


HOSTILE_NESTING = {
    "flow nesting": ("queues: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 100"),
    "block nesting": (
        "queues:\n  q:\n    command: [/bin/true]\n    env: " + "{a: " * 900 + "1" + "}" * 900,
        "nested more than 100",
    ),
    "an alias inside its own anchor": (
        "queues:\n  q:\n    command: [/bin/true]\n    env: &a {x: *a}\n",
        "an alias inside its own anchor",
    ),
    "aliases of aliases": (_laughs() + "queues: {}\n", "more than 10000 values"),
}


@pytest.mark.parametrize("case", list(HOSTILE_NESTING))
def test_a_config_nested_too_deep_or_wide_is_a_problem_not_a_crash(
    tmp_path: Path, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found in review: a deeply nested file made `load` raise RecursionError (not a config
    problem): `jobd validate` crashed with a traceback, and a reload never ended (no READY=1
    after RELOADING=1). A self-referencing alias never ended either, and aliases of aliases
    expanded without bound."""
    text, message = HOSTILE_NESTING[case]
    # Built up to the limit, 1 000 000 values would raise this worker's peak memory to some
    # hundreds of MiB, which every process it starts later inherits in its getrusage peak (exec
    # keeps it: see test_cost's large launcher); the mechanism is the same at 10 000.
    monkeypatch.setattr(yamlsrc, "MAX_VALUES", 10_000)
    path = tmp_path / "jobd.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load(str(path))
    (problem,) = caught.value.problems
    assert message in problem.message and problem.pos.line >= 1, problem
