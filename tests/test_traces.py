"""Trace context that crosses into handlers (issue 34): a producer's W3C ``traceparent``,
``tracestate`` and ``baggage`` (``jobd enqueue --traceparent``, the producer's own TRACEPARENT,
an --ndjson key, or plain fields from any language) reach the handler as TRACEPARENT,
TRACESTATE and BAGGAGE; the trace id is in the job's history records, its events and its log
lines; invalid values are dropped and the job still runs; a handler's own `jobd enqueue` keeps
the trace. With the ``otel`` extra and ``tracing`` on, jobd's spans of the wait and of the
attempt reach an OTLP collector, and a handler using the OpenTelemetry SDK joins the trace as
the attempt's child.

Real `jobd run` daemons against the session's private Redis; handlers write what they got into
files the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from support import DaemonProcess, jobd_cli, wait_until

from jobd import trace
from jobd.job import Job
from jobd.newjob import HostClock, NewJob, prepare

Daemon = Callable[..., DaemonProcess]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
PARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
STATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
BAGGAGE = "tenant=acme,region=eu%201;prop"
WORKTREE = str(Path(__file__).resolve().parent.parent)
# The otel extra as pyproject.toml names it (installed for these tests only: ``otel_site``).
OTEL_EXTRA = ("opentelemetry-sdk>=1.20", "opentelemetry-exporter-otlp-proto-http>=1.20")

# A handler that writes the trace variables it got (and its job id) as JSON into $OUT/<job id>.
ENV_HANDLER = """\
    #!{python}
    import json, os
    names = ("TRACEPARENT", "TRACESTATE", "BAGGAGE")
    got = {{name: os.environ.get(name) for name in names}}
    with open(os.path.join({out!r}, os.environ["JOBD_JOB_ID"]), "w") as f:
        json.dump(got, f)
"""


def config_text(tmp_path: Path, command: str, extra: str = "") -> str:
    return (
        "redis: {url: '{redis}'}\n"
        "queues:\n"
        "  q:\n"
        f"    command: [{command}]\n"
        f"    env: {{PYTHONPATH: {WORKTREE!r}}}\n"
        "  q2:\n"
        f"    command: [{command}]\n"
        f"    env: {{PYTHONPATH: {WORKTREE!r}}}\n"
        f"{extra}"
    )


@pytest.fixture
def out(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.fixture
def env_config(
    tmp_path: Path, out: Path, script: Callable[[str, str], Path], write_config: Callable[..., Path]
) -> Path:
    script("h.py", ENV_HANDLER.format(python=sys.executable, out=str(out)))
    return write_config(config_text(tmp_path, "./h.py"))


def got(out: Path, job_id: str) -> dict[str, str | None]:
    path = out / job_id
    wait_until(path.exists, what=f"the handler of {job_id}")
    wait_until(lambda: path.stat().st_size > 0, what=f"what the handler of {job_id} wrote")
    return json.loads(path.read_text())


def enqueue(config: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = jobd_cli("enqueue", "-c", str(config), *args, env=env)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().strip()


def records(config: Path, queue: str, job_id: str) -> list[dict]:
    shown = jobd_cli("job", "-c", str(config), queue, "--json", job_id)
    return json.loads(shown.stdout)["records"] if shown.returncode == 0 else []


def done_record(config: Path, queue: str, job_id: str) -> dict:
    def ended() -> bool:
        return any(r.get("event") == "done" for r in records(config, queue, job_id))

    wait_until(ended, what=f"{job_id}'s done record")
    return next(r for r in records(config, queue, job_id) if r.get("event") == "done")


# -- the grammar ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "usable"),
    [
        (PARENT, True),
        (PARENT.upper(), False),  # lowercase hex only
        ("ff" + PARENT[2:], False),  # version ff is invalid
        (f"00-{'0' * 32}-{SPAN_ID}-01", False),  # all-zero trace id
        (f"00-{TRACE_ID}-{'0' * 16}-01", False),  # all-zero parent id
        (PARENT + "-more", False),  # version 00 has four parts exactly
        ("01" + PARENT[2:] + "-more", True),  # a later version may have more
        (PARENT[:-1], False),
        ("", False),
    ],
)
def test_traceparent_grammar(value: str, usable: bool) -> None:
    assert trace.valid_traceparent(value.encode()) is usable


@pytest.mark.parametrize(
    "tail", [b"\xff", b"\x00", b"\x1b[2J\r", b" spaced", b"caf\xc3\xa9", b"a\tb", b"a\nb"]
)
def test_a_later_versions_tail_is_visible_ascii_only(tail: bytes) -> None:
    """W3C leaves what follows a later version's flags to that version; jobd takes visible
    ASCII there and nothing else (a NUL cannot go into an environment, a byte that is not
    ASCII is no header's)."""
    later = ("01" + PARENT[2:]).encode()
    assert trace.valid_traceparent(later + b"-ab-c_d.e~!")
    assert not trace.valid_traceparent(later + b"-" + tail)


def test_tracestate_and_baggage_grammar_and_sizes() -> None:
    assert trace.valid_tracestate(STATE.encode())
    assert trace.valid_tracestate(b"tenant@vendor=x, ,b=2")  # multi-tenant key, empty member
    assert not trace.valid_tracestate(b"a=1,a=2")  # a key once
    assert not trace.valid_tracestate(b"Upper=1")
    assert not trace.valid_tracestate(",".join(f"k{n}=v" for n in range(33)).encode())
    assert not trace.valid_tracestate(b"k=" + b"v" * 255 + b",j=" + b"v" * 255)  # > 512 bytes
    assert trace.valid_baggage(BAGGAGE.encode())
    assert not trace.valid_baggage(b'k="quoted"')
    assert not trace.valid_baggage(b"no-value")
    assert not trace.valid_baggage(("k=" + "v" * 8191).encode())  # > 8192 bytes


def test_an_entry_keeps_only_what_is_usable_and_a_retry_leaves_the_rest_behind() -> None:
    fields = {b"payload": b"x", b"traceparent": PARENT.encode(), b"tracestate": b"Bad=",
              b"baggage": b"k=v"}  # fmt: skip
    job = Job.from_entry("q", b"1-0", fields)
    assert job.trace is not None
    assert (job.trace.trace_id, job.trace.dropped) == (TRACE_ID, ("tracestate",))
    assert job.tag("q").endswith(f" trace={TRACE_ID}")
    assert b"tracestate" not in job.next_attempt_fields()
    assert job.next_attempt_fields()[b"traceparent"] == PARENT.encode()
    orphan = Job.from_entry("q", b"1-0", {b"payload": b"x", b"tracestate": STATE.encode()})
    assert orphan.trace is not None and orphan.trace.dropped == ("tracestate",)  # alone: dropped
    assert Job.from_entry("q", b"1-0", {b"payload": b"x"}).trace is None


# What a kept value may hold: visible ASCII, and the space and the tab (baggage's white space).
SAFE = frozenset(range(0x20, 0x7F)) | {0x09}
# Hostile values: any bytes, and any bytes after a usable start (what a grammar's tail sees).
HOSTILE = st.one_of(
    st.binary(max_size=600),
    st.builds(bytes.__add__, st.sampled_from([f"01{PARENT[2:]}-".encode(), PARENT.encode(),
                                              b"k=v;p=", b"k=v,", b"a@b=c,"]),
              st.binary(max_size=80)),
)  # fmt: skip
FIELD_NAMES = [b"traceparent", b"tracestate", b"baggage", b"job_id", b"jobd_job_id",
               b"jobd_attempt", b"jobd_timeout", b"jobd_max_attempts", b"jobd_expires_at",
               b"jobd_oversize", b"jobd_overwide", b"jobd_unique", b"payload"]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELD_NAMES), HOSTILE, min_size=1))
def test_no_field_of_an_entry_makes_reading_it_raise(fields: dict[bytes, bytes]) -> None:
    """Any bytes in any of the fields jobd reads: ``Job.from_entry`` (every entry goes through
    it, on the reader's path) never raises, and what it keeps of the trace context is what the
    handler's environment can take."""
    job = Job.from_entry("q", b"1-0", fields)
    job.tag("q")
    job.next_attempt_fields()
    if job.trace is None:
        return
    environment = job.trace.environment()
    for value in environment.values():
        assert set(value.encode("ascii")) <= SAFE, value
    if job.trace.traceparent is not None:
        assert set(job.trace.traceparent.encode()) <= set(range(0x21, 0x7F))
    for key in trace.KEYS:
        given_ = fields.get(key.encode()) is not None  # kept, or said dropped
        assert not given_ or key in job.trace.dropped or getattr(job.trace, key) is not None


def test_the_python_api_takes_the_environment_when_nothing_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRACEPARENT", PARENT)
    monkeypatch.setenv("TRACESTATE", STATE)
    fields = prepare(NewJob(b"x"), HostClock())[0].fields
    assert (fields[b"traceparent"], fields[b"tracestate"]) == (PARENT.encode(), STATE.encode())
    assert b"traceparent" not in prepare(NewJob(b"x", traceparent=""), HostClock())[0].fields
    other = f"00-{'1' * 32}-{'2' * 16}-00"
    assert prepare(NewJob(b"x", traceparent=other), HostClock())[0].fields[b"traceparent"] == (
        other.encode()
    )
    with pytest.raises(ValueError, match="not a W3C traceparent"):
        prepare(NewJob(b"x", traceparent="nope"), HostClock())
    monkeypatch.setenv("TRACEPARENT", "garbage")  # the environment's never fails an enqueue
    assert b"traceparent" not in prepare(NewJob(b"x"), HostClock())[0].fields


# -- through a daemon -----------------------------------------------------------------------------


def test_enqueue_traceparent_reaches_the_handler_history_events_and_json_logs(
    env_config: Path, out: Path, daemon: Daemon
) -> None:
    d = daemon(env_config, env={"JOBD_LOG_FORMAT": "json"})
    job_id = enqueue(env_config, "q", "x", "--job-id", "traced", "--traceparent", PARENT,
                     "--tracestate", STATE, "--baggage", BAGGAGE)  # fmt: skip
    assert got(out, job_id) == {"TRACEPARENT": PARENT, "TRACESTATE": STATE, "BAGGAGE": BAGGAGE}
    assert done_record(env_config, "q", job_id)["trace_id"] == TRACE_ID
    events = jobd_cli("events", "-c", str(env_config), "q", "--json").stdout.decode()
    done = [json.loads(line) for line in events.splitlines() if '"done"' in line]
    assert [e["trace_id"] for e in done] == [TRACE_ID]
    d.wait_log("exit 0")
    lines = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
    mine = [line for line in lines if line.get("job") == "traced"]
    assert mine and all(line["trace_id"] == TRACE_ID for line in mine)
    assert any("exit 0" in line["message"] for line in mine)


def test_the_producers_environment_and_an_ndjson_key_are_taken(
    env_config: Path, out: Path, daemon: Daemon, tmp_path: Path
) -> None:
    daemon(env_config)
    environ = {"TRACEPARENT": PARENT, "BAGGAGE": "k=v"}
    job_id = enqueue(env_config, "q", "x", "--job-id", "from-env", env=environ)
    assert got(out, job_id) == {"TRACEPARENT": PARENT, "TRACESTATE": None, "BAGGAGE": "k=v"}
    other = f"00-{'a' * 32}-{'b' * 16}-01"
    lines = tmp_path / "jobs.ndjson"
    lines.write_text(json.dumps({"payload": "x", "job_id": "nd", "traceparent": other}) + "\n")
    enqueue(env_config, "q", "--ndjson", str(lines), env=environ)  # the line's own, whole
    assert got(out, "nd") == {"TRACEPARENT": other, "TRACESTATE": None, "BAGGAGE": None}
    none = enqueue(env_config, "q", "x", "--job-id", "none", "--traceparent", "", env=environ)
    assert got(out, none) == {"TRACEPARENT": None, "TRACESTATE": None, "BAGGAGE": None}
    assert "trace_id" not in done_record(env_config, "q", none)


def test_invalid_values_are_dropped_and_the_job_still_runs(
    env_config: Path, out: Path, daemon: Daemon, r: redis.Redis
) -> None:
    d = daemon(env_config)
    bad = {"traceparent": "ff" + PARENT[2:], "tracestate": STATE, "baggage": "k=" + "v" * 9000}
    r.xadd("jobd:q", {"payload": "x", "job_id": "bad", **bad})  # any language's producer
    assert got(out, "bad") == {"TRACEPARENT": None, "TRACESTATE": None, "BAGGAGE": None}
    assert "trace_id" not in done_record(env_config, "q", "bad")
    d.wait_log("dropping traceparent")
    assert "dropping baggage" in d.log() and "dropping tracestate" in d.log()
    refused = jobd_cli("enqueue", "-c", str(env_config), "q", "x", "--traceparent", "nope")
    assert refused.returncode == 2 and b"not a W3C traceparent" in refused.stderr


def test_a_later_version_traceparent_with_a_non_ascii_tail_stalls_the_jobs_read_with_it(
    r: redis.Redis, env_config: Path, out: Path, daemon: Daemon
) -> None:
    """A version 01 traceparent whose tail is b'\\xff' made Job.from_entry raise (it was
    checked as '-' and anything, then decoded as ASCII): the reader failed, the jobs read with
    it never ran, and the entry was never dead-lettered (each reclaim raised before its poison
    check). Now the field is dropped and all three run."""
    bad = f"01-{TRACE_ID}-{SPAN_ID}-01-".encode() + b"\xff"
    r.xadd("jobd:q", {b"payload": b"x", b"job_id": b"before"})
    r.xadd("jobd:q", {b"payload": b"x", b"job_id": b"hostile", b"traceparent": bad})
    r.xadd("jobd:q", {b"payload": b"x", b"job_id": b"after"})
    d = daemon(env_config)
    assert got(out, "before")["TRACEPARENT"] is None
    assert got(out, "hostile")["TRACEPARENT"] is None  # dropped: the job runs without it
    assert got(out, "after")["TRACEPARENT"] is None
    d.wait_log("dropping traceparent")
    assert "Traceback" not in d.log()


def test_a_later_version_traceparent_with_a_nul_in_its_tail_still_runs_its_job(
    r: redis.Redis, env_config: Path, out: Path, daemon: Daemon
) -> None:
    """A NUL, an ESC or a CR after a version 01 traceparent's flags was kept, and put into the
    handler's environment, where a NUL cannot go: the handler never started. It is dropped."""
    bad = f"01-{TRACE_ID}-{SPAN_ID}-01-".encode() + b"\x00\x1b[2J\r"
    r.xadd("jobd:q", {b"payload": b"x", b"job_id": b"nul", b"traceparent": bad,
                      b"baggage": b"k=v"})  # fmt: skip
    d = daemon(env_config)
    assert got(out, "nul") == {"TRACEPARENT": None, "TRACESTATE": None, "BAGGAGE": "k=v"}
    assert "Traceback" not in d.log()


def test_a_handlers_follow_up_keeps_the_trace(
    tmp_path: Path, out: Path, script: Callable[[str, str], Path],
    write_config: Callable[..., Path], daemon: Daemon,
) -> None:  # fmt: skip
    """A handler that runs `jobd enqueue` with no trace flag: its TRACEPARENT goes along."""
    script("h.py", ENV_HANDLER.format(python=sys.executable, out=str(out)))
    config = tmp_path / "jobd.yaml"
    script(
        "first.sh",
        f"#!/bin/sh\nexec {sys.executable} -m jobd enqueue -c {config} q2 y --job-id follow-up\n",
    )
    text = config_text(tmp_path, "./h.py").replace("[./h.py]", "[./first.sh]", 1)
    write_config(text)
    daemon(config)
    enqueue(config, "q", "x", "--job-id", "first", "--traceparent", PARENT, "--baggage", "k=v")
    assert got(out, "follow-up") == {"TRACEPARENT": PARENT, "TRACESTATE": None, "BAGGAGE": "k=v"}
    assert done_record(config, "q2", "follow-up")["trace_id"] == TRACE_ID


# -- the otel extra -------------------------------------------------------------------------------

# A handler using the OpenTelemetry SDK with its in-memory exporter: its span joins the trace of
# TRACEPARENT; it writes its finished spans into $OUT/<job id>.
OTEL_HANDLER = """\
    #!{python}
    import json, os
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    carrier = {{"traceparent": os.environ.get("TRACEPARENT", "")}}
    parent = TraceContextTextMapPropagator().extract(carrier)
    with provider.get_tracer("handler").start_as_current_span("handler work", context=parent):
        pass
    spans = [
        {{"trace_id": f"{{s.context.trace_id:032x}}", "span_id": f"{{s.context.span_id:016x}}",
          "parent": None if s.parent is None else f"{{s.parent.span_id:016x}}"}}
        for s in exporter.get_finished_spans()
    ]
    with open(os.path.join({out!r}, os.environ["JOBD_JOB_ID"]), "w") as f:
        json.dump(spans, f)
"""


class Collector:
    """An OTLP/HTTP traces endpoint: the spans it was sent, decoded."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans: list[dict[str, Any]] = []
        collector = self

        class Receive(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans += [{
                            "name": s.name, "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                            "attributes": {a.key: a.value for a in s.attributes},
                            "end": s.end_time_unix_nano,
                        } for s in scope.spans]  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Receive)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="session")
def otel_site(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the otel extra is for these tests: installed once a session into a folder of its
    own (pip --target), not into the test venv, where redis-py would import its metrics SDK in
    every Python process of the suite (about 55 ms each: every jobd command, daemon and Python
    handler). Its path goes after the venv's, on the test's sys.path and on the daemon's and
    the handlers' PYTHONPATH."""
    target = tmp_path_factory.mktemp("otel")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--target", str(target), *OTEL_EXTRA],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    if str(target) not in sys.path:
        sys.path.append(str(target))
    return str(target)


@pytest.fixture
def collector(otel_site: str) -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()
    c.server.server_close()


def otel_config(tmp_path: Path, out: Path, script: Callable[[str, str], Path],
                write_config: Callable[..., Path], site: str, tracing: str = "") -> Path:  # fmt: skip
    """A config whose handlers (./h.py, the SDK's in-memory exporter) find the otel extra."""
    script("h.py", OTEL_HANDLER.format(python=sys.executable, out=str(out)))
    path = os.pathsep.join([WORKTREE, site])
    return write_config(
        config_text(tmp_path, "./h.py", tracing).replace(repr(WORKTREE), repr(path))
    )


def otel_env(site: str) -> dict[str, str]:
    """The daemon's environment for tracing: the otel extra found, spans sent every 0.1 s."""
    return {"PYTHONPATH": os.pathsep.join([WORKTREE, site]), "OTEL_BSP_SCHEDULE_DELAY": "100"}


def test_a_handler_using_the_sdk_joins_the_producers_trace(
    tmp_path: Path, out: Path, script: Callable[[str, str], Path],
    write_config: Callable[..., Path], daemon: Daemon, otel_site: str,
) -> None:  # fmt: skip
    """Tracing off: the handler's span is the producer's span's child."""
    config = otel_config(tmp_path, out, script, write_config, otel_site)
    daemon(config)
    enqueue(config, "q", "x", "--job-id", "sdk", "--traceparent", PARENT)
    wait_until(lambda: (out / "sdk").exists() and (out / "sdk").stat().st_size > 0)
    [span] = json.loads((out / "sdk").read_text())
    assert (span["trace_id"], span["parent"]) == (TRACE_ID, SPAN_ID)


def test_with_tracing_on_jobd_spans_the_wait_and_the_attempt_and_the_handler_is_its_child(
    tmp_path: Path, out: Path, script: Callable[[str, str], Path],
    write_config: Callable[..., Path], daemon: Daemon, collector: Collector, otel_site: str,
) -> None:  # fmt: skip
    tracing = f"tracing: {{otlp_endpoint: {collector.url!r}}}\n"
    config = otel_config(tmp_path, out, script, write_config, otel_site, tracing)
    d = daemon(config, env=otel_env(otel_site))
    enqueue(config, "q", "x", "--job-id", "spanned", "--traceparent", PARENT)
    wait_until(lambda: (out / "spanned").exists() and (out / "spanned").stat().st_size > 0)
    [handler] = json.loads((out / "spanned").read_text())
    wait_until(lambda: {"wait q", "process q"} <= {s["name"] for s in collector.spans},
               what="jobd's spans at the collector")  # fmt: skip
    spans = {s["name"]: s for s in collector.spans}
    attempt, wait = spans["process q"], spans["wait q"]
    assert attempt["trace_id"] == wait["trace_id"] == handler["trace_id"] == TRACE_ID
    assert attempt["parent"] == wait["parent"] == SPAN_ID  # the producer's span
    assert handler["parent"] == attempt["span_id"]  # the handler's span: the attempt's child
    assert attempt["attributes"]["jobd.job_id"].string_value == "spanned"
    assert attempt["attributes"]["jobd.attempt"].int_value == 1
    assert attempt["attributes"]["jobd.outcome"].string_value == "done"
    assert d.stop() == 0
    assert "tracing on" in d.log()


def test_the_spans_of_a_job_whose_id_is_not_utf8_are_exported(
    r: redis.Redis, tmp_path: Path, out: Path, script: Callable[[str, str], Path],
    write_config: Callable[..., Path], daemon: Daemon, collector: Collector, otel_site: str,
) -> None:  # fmt: skip
    """A job id is any bytes: the span's job id attributes show it as the logs do (\\xff),
    for an attribute must be UTF-8 (the exporter's thread failed on the whole batch, its
    traceback on the daemon's stderr, and no span reached the collector)."""
    tracing = f"tracing: {{otlp_endpoint: {collector.url!r}}}\n"
    config = otel_config(tmp_path, out, script, write_config, otel_site, tracing)
    d = daemon(config, env=otel_env(otel_site))
    r.xadd("jobd:q", {b"payload": b"x", b"job_id": b"\xffid", b"traceparent": PARENT.encode()})
    wait_until(lambda: "process q" in {s["name"] for s in collector.spans},
               what="jobd's attempt span at the collector")  # fmt: skip
    attempt = next(s for s in collector.spans if s["name"] == "process q")
    assert attempt["attributes"]["jobd.job_id"].string_value == "\\xffid"
    assert attempt["attributes"]["messaging.message.id"].string_value == "\\xffid"
    assert d.stop() == 0
    assert "Traceback" not in d.log()


def test_tracing_configured_without_the_extra_is_said_and_jobs_still_run(
    env_config: Path, out: Path, daemon: Daemon, tmp_path: Path
) -> None:
    """A daemon whose Python cannot import the SDK (a path that hides it) runs on without."""
    text = env_config.read_text() + "tracing: {enabled: true}\n"
    env_config.write_text(text)
    hide = tmp_path / "hide" / "opentelemetry"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('hidden for this test')\n")
    path = os.pathsep.join([str(hide.parent), WORKTREE])
    d = daemon(env_config, env={"PYTHONPATH": path})
    job_id = enqueue(env_config, "q", "x", "--job-id", "no-sdk", "--traceparent", PARENT)
    assert got(out, job_id)["TRACEPARENT"] == PARENT
    d.wait_log("tracing is configured but cannot start")
    assert "Traceback" not in d.log()


# Writes many delayed follow-ups (their parse takes a while, off the loop), then the wall-clock
# nanoseconds just before it exits into $OUT/exit.
SLOW_PARSE_HANDLER = """\
    #!{python}
    import json, os, time
    line = json.dumps({{"queue": "q2", "payload": "p" * 200, "delay": "1h"}}) + "\\n"
    with open(os.environ["JOBD_ENQUEUE"], "w") as f:
        f.write(line * 10000)
    with open(os.path.join({out!r}, "exit"), "w") as f:
        f.write(str(time.time_ns()))
"""


def test_the_attempts_span_ends_at_the_handlers_exit_not_when_its_follow_ups_are_parsed(
    tmp_path: Path, out: Path, script: Callable[[str, str], Path],
    write_config: Callable[..., Path], daemon: Daemon, collector: Collector, otel_site: str,
) -> None:  # fmt: skip
    """Review 34n: the span ended when the outcome was decided, after the handler left the
    table (its last messages) and its follow-ups' parse (here 10 000 lines, a few hundred ms)."""
    script("h.py", SLOW_PARSE_HANDLER.format(python=sys.executable, out=str(out)))
    tracing = f"tracing: {{otlp_endpoint: {collector.url!r}}}\n"
    config = write_config(config_text(tmp_path, "./h.py", tracing))
    d = daemon(config, env=otel_env(otel_site))
    enqueue(config, "q", "x", "--job-id", "parsed", "--traceparent", PARENT)
    wait_until(lambda: "process q" in {s["name"] for s in collector.spans},
               what="jobd's attempt span at the collector")  # fmt: skip
    attempt = next(s for s in collector.spans if s["name"] == "process q")
    exited = int((out / "exit").read_text())
    print(f"span end - handler exit: {(attempt['end'] - exited) / 1e6:.1f} ms")
    assert attempt["attributes"]["jobd.outcome"].string_value == "done"
    assert 0 <= attempt["end"] - exited < 200_000_000  # the exit seen, not the parse's end
    assert d.stop() == 0
