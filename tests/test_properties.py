"""Property tests: arbitrary input never raises anything but the documented errors."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from jobd.config import ConfigError, load
from jobd.job import Job
from jobd.store.keys import QueueKeys, can_derive

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/root"}
KEYS = ["queues", "defaults", "redis", "shutdown_grace", "command", "concurrency", "timeout",
        "lease", "renew_every", "reclaim_after", "retry", "max_attempts", "env", "stream",
        "dead_letter", "retention", "maxlen", "url", "limits", "run_as", "q", "x"]  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["1s", "250ms", "5m", "${X}", "${X:-3}", "/bin/true"]),
)  # fmt: skip
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), inner, max_size=5),
    ),
    max_leaves=25,
)


def load_text(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_bytes(data)
        try:
            load(str(path), ENV)
        except ConfigError as exc:
            assert exc.problems, "a ConfigError always carries at least one problem"
            for problem in exc.problems:
                assert "\n" not in problem.format("f") or "YAML" in problem.message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_any_bytes_load_or_raise_config_error(data: bytes) -> None:
    load_text(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text_loads_or_raises_config_error(text: str) -> None:
    load_text(text.encode())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_any_yaml_structure_loads_or_raises_config_error(doc: object) -> None:
    load_text(yaml.safe_dump(doc).encode())


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.binary(max_size=12),
            st.sampled_from([b"payload", b"job_id", b"jobd_job_id", b"jobd_attempt"]),
        ),
        st.binary(max_size=40),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 2**63),
    st.integers(0, 2**63),
)
def test_any_stream_entry_parses(fields: dict[bytes, bytes], ms: int, seq: int) -> None:
    job = Job.from_entry("q", f"{ms}-{seq}".encode(), fields)
    assert isinstance(job.stdin_bytes(), bytes)
    assert job.attempt >= 1
    assert job.job_id and "\0" not in job.job_id
    assert job.payload_size() == len(job.stdin_bytes())
    nxt = job.next_attempt_fields()
    assert nxt[b"jobd_attempt"] == str(job.attempt + 1).encode()


@given(
    st.one_of(
        st.text(max_size=16),
        st.builds(lambda a, b, c: a + "{" + b + "}" + c, *[st.text(max_size=6)] * 3),
        st.builds(lambda a, b: a + "{" + b, st.text(max_size=6), st.text(max_size=6)),
    ).filter(can_derive)
)
def test_every_key_of_a_queue_is_in_its_streams_cluster_slot(stream: str) -> None:
    """Checked against redis-py's implementation of Redis Cluster's slot rule (CRC16 of the
    first non-empty {...}, else of the whole key)."""
    slot = key_slot(stream.encode())
    keys = QueueKeys.of(stream)
    for key in (keys.dead_letter, keys.delayed, keys.stats(0), keys.stats(29_000_000)):
        assert key_slot(key.encode()) == slot, key
