"""The dashboard and metrics server against hostile clients (issue 17): stalled connections,
DNS rebinding, bad records and bodies, huge records, and the token on /metrics. Real daemons
and `jobd dashboard` processes, real sockets on loopback."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from support import DaemonProcess, acked_all, free_port, queue_config, wait_until

Daemon = Callable[..., DaemonProcess]
TOKEN = "security-token-0123456789"
STALLED = 300  # idle, half-sent connections a client opens
NOFILE = 256  # the daemon's descriptor limit in the starvation test
SERVER_FDS = 80  # descriptors the server may hold beyond the daemon's own (its cap is 64)
REQUEST_TIMEOUT = 10  # seconds the server gives a request to arrive (server.TIMEOUT)


# -- helpers -------------------------------------------------------------------------------------


def request(
    port: int,
    path: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 5.0,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request on a fresh connection, sent exactly as given (Host and Content-Length
    included when ``headers`` has them)."""
    headers = headers or {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body is not None and "Content-Length" not in headers:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        reply = conn.getresponse()
        return reply.status, reply.headers, reply.read()
    finally:
        conn.close()


def answers(port: int) -> bool:
    try:
        request(port, "/healthz", timeout=1)
    except OSError:
        return False
    return True


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def dead_letter(r: redis.Redis, stream: str = "{jobd:q}:dead", **fields: bytes | str) -> str:
    """A dead-letter record as jobd writes it, with ``fields`` changed."""
    record: dict[str, bytes | str] = {
        "payload": "p", "jobd_job_id": "j-1", "jobd_queue": "q", "jobd_original_id": "1-0",
        "jobd_error": "exit", "jobd_exit_code": "65", "jobd_signal": "", "jobd_attempts": "1",
        "jobd_failed_at": "1795960000000", "jobd_stderr": "Traceback: boom\n",
    }  # fmt: skip
    return r.xadd(stream, {**record, **fields}).decode()


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Callable[[Path], tuple[int, int]]]:
    """`jobd dashboard -c CONFIG --listen 127.0.0.1:PORT`; returns its port and pid."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(config: Path) -> tuple[int, int]:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobd", "dashboard", "-c", str(config),
             "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(proc)
        wait_until(lambda: answers(port), what="the dashboard to answer")
        return port, proc.pid

    yield start
    for proc in procs:
        proc.terminate()
        assert proc.wait(10) == 0


def with_token(write_config: Callable[..., Path], tmp_path: Path, more: str = "") -> Path:
    (tmp_path / "token").write_text(TOKEN + "\n")
    return write_config(
        queue_config("[/bin/true]")
        + f"dashboard: {{actions: true, token_file: token, show_payloads: true{more}}}\n"
    )


def csrf(port: int) -> dict[str, str]:
    """The headers an action needs: the token and the CSRF value the API gives."""
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    code, _, body = request(port, "/api/overview", headers=bearer)
    assert code == 200, body
    return {**bearer, "X-Jobd-CSRF": json.loads(body)["csrf"]}


# -- (2) stalled connections ---------------------------------------------------------------------


def test_stalled_connections_starve_neither_the_server_nor_the_jobs(
    r: redis.Redis, write_config, script, daemon: Daemon, tmp_path: Path
) -> None:
    script("h.sh", "#!/bin/sh\ncat >/dev/null\nexit 0\n")
    port = free_port()
    config = write_config(queue_config("[./h.sh]") + f"metrics: {{listen: '127.0.0.1:{port}'}}\n")
    d = daemon(config)
    pid = d.proc.pid
    wait_until(lambda: answers(port), what="the metrics server to answer")
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (NOFILE, NOFILE))  # as a host may have it
    fds, tasks = descriptors(pid), threads(pid)
    with contextlib.ExitStack() as stack:
        opened = 0
        for _ in range(STALLED):
            try:
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), 2))
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
            except OSError:
                break  # the server takes no more connections: checked below
            opened += 1
        assert opened == STALLED, f"the server stopped taking connections after {opened}"
        # /healthz answers at once, behind every stalled connection.
        assert request(port, "/healthz", timeout=3)[::2] == (200, b"ok\n")
        assert descriptors(pid) <= fds + SERVER_FDS, "the server's descriptors are capped"
        assert threads(pid) <= tasks + 2, "no thread per connection"
        r.xadd("jobd:q", {"payload": "x"})
        wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job to run")
        assert r.xlen("{jobd:q}:dead") == 0, d.log()


def test_a_request_must_arrive_whole_within_the_timeout(
    r: redis.Redis, write_config, dashboard
) -> None:
    port, _ = dashboard(write_config(queue_config("[/bin/true]")))
    with (
        socket.create_connection(("127.0.0.1", port), 2) as idle,
        socket.create_connection(("127.0.0.1", port), 2) as trickle,
    ):
        trickle.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")

        def both_closed() -> bool:
            with contextlib.suppress(OSError):
                trickle.send(b"a")  # a byte every poll: never idle, never whole
            return closed_by_peer(idle) and closed_by_peer(trickle)

        wait_until(both_closed, REQUEST_TIMEOUT + 10, "the server to close both")
        # Requests that arrive whole are answered meanwhile and after.
        assert request(port, "/api/overview")[0] == 200


# -- (review 17, 2) pipelined requests whose answers are never read ------------------------------

ONE = b"GET /api/overview HTTP/1.1\r\n\r\n"
BURST = ONE * (8192 // len(ONE))  # 273 pipelined requests in one 8 KiB read
FLOODS = 4  # connections sending a burst each (as many as the server has workers)
HEALTHZ_WITHIN = 2.0  # seconds /healthz may take meanwhile
PROBING = 6.0  # seconds /healthz is probed for while the bursts sit unread
SHOWN_FIELDS = ("jobd_job_id", "jobd_error", "jobd_exit_code", "jobd_signal", "jobd_attempts")
TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8  # linux/tcp_states.h


def flood(port: int) -> socket.socket:
    """A connection that sends one burst of pipelined requests and reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(BURST)
    return sock


def answered(sock: socket.socket) -> bool:
    """Whether some answer has arrived on ``sock`` (left unread)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


def closed_unread(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock``'s connection, told without reading from it
    (reading would let the server send more, and so keep the connection busy)."""
    state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
    return state in (TCP_CLOSE, TCP_CLOSE_WAIT)


def healthz_keeps_answering(port: int) -> None:
    """/healthz answers within HEALTHZ_WITHIN on every try for PROBING seconds."""
    end = time.monotonic() + PROBING
    while time.monotonic() < end:
        code, _, body = request(port, "/healthz", timeout=HEALTHZ_WITHIN)
        assert (code, body) == (200, b"ok\n")
        time.sleep(0.2)  # a pace between tries, not a wait for anything


def test_pipelined_requests_never_read_hold_no_worker(
    r: redis.Redis, write_config, script, daemon: Daemon
) -> None:
    """The reviewer's scenario: every worker answered one burst's requests one after another
    until 16 MiB waited unsent, then blocked for good (the connection, having requests queued,
    was never timed out): /healthz timed out until the clients went away."""
    script("h.sh", "#!/bin/sh\ncat >/dev/null\nexit 0\n")
    port = free_port()
    config = write_config(queue_config("[./h.sh]") + f"metrics: {{listen: '127.0.0.1:{port}'}}\n")
    d = daemon(config)
    wait_until(lambda: answers(port), what="the metrics server to answer")
    control = b"\x01" * 300  # 6 bytes of JSON each: an overview of about 400 KiB
    for _ in range(20):
        dead_letter(r, jobd_stderr=control * 10, **dict.fromkeys(SHOWN_FIELDS, control))
    with contextlib.ExitStack() as stack:
        floods = [stack.enter_context(flood(port)) for _ in range(FLOODS)]
        wait_until(lambda: all(map(answered, floods)), what="an answer on every burst")
        healthz_keeps_answering(port)
        r.xadd("jobd:q", {"payload": "x"})
        wait_until(lambda: acked_all(r, "jobd:q", 1), what="the job to run")
        assert r.xlen("{jobd:q}:dead") == 20, d.log()
        wait_until(
            lambda: all(map(closed_unread, floods)),
            REQUEST_TIMEOUT + 10,
            "the server to close every connection that reads nothing",
        )
    assert request(port, "/healthz", timeout=HEALTHZ_WITHIN)[::2] == (200, b"ok\n")


# -- (3) DNS rebinding ---------------------------------------------------------------------------

FOREIGN = (
    "evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example",
    "evil.example@127.0.0.1", "127.0.0.1:{port}/x", "[::1",
)  # fmt: skip
OWN = ("127.0.0.1:{port}", "127.0.0.1", "localhost:{port}", "LOCALHOST.", "[::1]:{port}")


def test_a_request_naming_another_host_gets_421(
    r: redis.Redis, write_config, daemon: Daemon, dashboard
) -> None:
    dead_letter(r, jobd_stderr="the tail of stderr")
    port = free_port()
    config = write_config(
        queue_config("[/bin/true]") + f"metrics: {{listen: '127.0.0.1:{port}'}}\n"
    )
    daemon(config)
    wait_until(lambda: answers(port), what="the metrics server to answer")
    cli_port, _ = dashboard(config)
    pages = ("/", "/api/overview", "/static/dashboard.js")
    for server, paths in ((port, (*pages, "/metrics")), (cli_port, pages)):
        for path in paths:
            for host in FOREIGN:
                code, headers, body = request(
                    server, path, headers={"Host": host.format(port=server)}
                )
                assert code == 421, (server, path, host, body)
                assert b"tail of stderr" not in body and b"jobd_" not in body
                assert headers["Content-Type"] == "application/json"
            for host in OWN:
                code, _, body = request(server, path, headers={"Host": host.format(port=server)})
                assert code == 200, (server, path, host, body)
    code, _, body = request(port, "/api/overview", headers={"Host": "127.0.0.1"})
    assert (
        b"tail of stderr" in json.loads(body)["queues"]["q"]["dead_letters"][0]["stderr"].encode()
    )


def test_names_in_allowed_hosts_are_answered(r: redis.Redis, write_config, dashboard) -> None:
    schema = json.loads(
        (Path(__file__).parent.parent / "jobd" / "config" / "schema.json").read_text()
    )
    if "allowed_hosts" not in schema["properties"]["dashboard"]["properties"]:
        pytest.skip("dashboard.allowed_hosts is not in the config schema yet")
    config = write_config(
        queue_config("[/bin/true]") + "dashboard: {allowed_hosts: [jobd.internal, Ops.Example]}\n"
    )
    port, _ = dashboard(config)
    for host in ("jobd.internal", f"jobd.internal:{port}", "ops.example:443", "OPS.EXAMPLE."):
        assert request(port, "/api/overview", headers={"Host": host})[0] == 200, host
    for host in ("evil.jobd.internal", "jobd.internal.evil.example", "evil.example"):
        assert request(port, "/api/overview", headers={"Host": host})[0] == 421, host


# -- (10) bad records and bad bodies -------------------------------------------------------------


def test_a_bad_record_is_shown_as_bad(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    dead_letter(r, jobd_job_id="good")
    dead_letter(r, jobd_job_id="nan", jobd_failed_at="notanumber")
    dead_letter(r, jobd_job_id="huge", jobd_failed_at="9" * 5000)
    r.xadd("{jobd:q}:dead", {"someone": "else's record", "jobd_stderr": b"\xff\xfe binary"})
    port, _ = dashboard(with_token(write_config, tmp_path))
    headers = csrf(port)
    code, _, body = request(port, "/api/overview", headers=headers)
    assert code == 200, body
    shown = {d["job_id"]: d for d in json.loads(body)["queues"]["q"]["dead_letters"]}
    assert shown["good"]["failed_at"] == 1795960000 and "bad" not in shown["good"]
    for job_id in ("nan", "huge"):
        assert shown[job_id]["failed_at"] is None and "not a time" in shown[job_id]["bad"]
    assert shown[""]["bad"] == "no jobd_failed_at" and shown[""]["stderr"] == "\\xff\\xfe binary"


def test_a_bad_body_gets_400_with_a_reason(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    good = dead_letter(r, jobd_job_id="good")
    port, _ = dashboard(with_token(write_config, tmp_path))
    headers = csrf(port)
    bodies = [
        b'{"queue": "q", "ids": 5}', b'{"queue": "q", "ids": [{}]}', b'{"queue": "q", "ids": "1-0"}',
        b'{"queue": "q", "ids": ["1-0\\n"]}', b'{"queue": "q", "ids": [1]}', b"[1]", b'"q"',
        b'{"queue": {}}', b'{"queue": ["q"]}', b'{"queue": "q", "all": "yes"}', b"{", b"\xff",
        b'{"queue": "q", "ids": [' + b'"1-0",' * 1000 + b'"1-0"]}',
    ]  # fmt: skip
    for bad in bodies:
        for action in ("requeue", "purge"):
            if action == "purge" and bad.startswith(b'{"queue": "q"'):
                continue  # a purge reads only the queue: these would be good purges
            code, _, reply = request(port, f"/api/dead-letters/{action}", "POST", headers, bad)
            assert code == 400 and json.loads(reply)["error"], (action, bad, reply)
    assert r.xlen("{jobd:q}:dead") == 1, "nothing moved by a bad body"
    code, _, reply = request(
        port,
        "/api/dead-letters/requeue",
        "POST",
        headers,
        json.dumps({"queue": "q", "ids": [good]}).encode(),
    )
    assert code == 200 and json.loads(reply)["requeued"] == [good]


# -- (11) huge records, and bodies larger than they say ------------------------------------------


def test_a_huge_record_is_read_only_in_what_the_page_shows(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    port, pid = dashboard(with_token(write_config, tmp_path))
    headers = {"Authorization": f"Bearer {TOKEN}"}
    dead_letter(r)
    assert request(port, "/api/overview", headers=headers)[0] == 200
    before = peak_rss_kib(pid)
    stderr = b"x" * (30 << 20) + b"the last line\n"
    dead_letter(r, jobd_stderr=stderr, payload=b"P" * (8 << 20), jobd_job_id=b"J" * (1 << 20))
    replies = [request(port, "/api/overview", headers=headers, timeout=10) for _ in range(3)]
    grown = peak_rss_kib(pid) - before
    assert grown < 12 * 1024, f"the dashboard grew by {grown} KiB for one huge record"
    assert all(code == 200 and len(body) < 64 * 1024 for code, _, body in replies)
    body = replies[-1][2]
    # The huge record alone: no record is read past READ_BUDGET bytes (it is read whole in Redis).
    [huge] = json.loads(body)["queues"]["q"]["dead_letters"]
    assert huge["stderr"].endswith("the last line\n") and len(huge["stderr"]) == 2048
    assert huge["payload"] == "P" * 4096 and huge["job_id"] == "J" * 1024
    assert set(huge["cut"]) == {"stderr", "payload", "job_id"}


def test_a_body_is_read_to_its_content_length_and_no_further(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    port, _ = dashboard(with_token(write_config, tmp_path))
    headers = csrf(port)
    path = "/api/dead-letters/requeue"
    # Sent without a body and the connection kept open: refused at once, not waited on.
    code, _, _ = request(port, path, "POST", {**headers, "Content-Length": "-1"}, timeout=3)
    assert code == 400
    code, _, _ = request(port, path, "POST", {**headers, "Content-Length": "9" * 12}, timeout=3)
    assert code == 413
    code, _, _ = request(port, path, "POST", {**headers, "Content-Length": "70000"}, timeout=3)
    assert code == 413
    good = b'{"queue": "q", "ids": []}'
    assert request(port, path, "POST", headers, good)[0] == 200


# -- (12) the token on /metrics ------------------------------------------------------------------


def test_metrics_need_the_token_and_healthz_says_only_ok(
    r: redis.Redis, write_config, daemon: Daemon, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    config = write_config(
        queue_config("[/bin/true]")
        + f"metrics: {{listen: '127.0.0.1:{port}'}}\ndashboard: {{token_file: token}}\n"
    )
    daemon(config)
    wait_until(lambda: answers(port), what="the metrics server to answer")
    code, headers, body = request(port, "/metrics")
    assert code == 401 and b"jobd_" not in body and headers["WWW-Authenticate"].startswith("Bearer")
    assert request(port, "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
    code, _, body = request(port, "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert code == 200 and b"jobd_jobs_started_total" in body
    assert request(port, "/healthz")[::2] == (200, b"ok\n")
    assert request(port, "/api/overview")[0] == 401


# -- (review 17, 3) no cookie carries the token --------------------------------------------------


def test_neither_a_cookie_nor_a_query_carries_the_token(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    """Cookies ignore ports: a cookie holding the token went to every other server on the host,
    and any of them could set one. Opening /?token=TOKEN set it, and put the token in logs."""
    port, _ = dashboard(with_token(write_config, tmp_path))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in (f"/?token={TOKEN}", "/?token=wrong", "/?x=1&token=", "/api/overview?token"):
        code, headers, body = request(port, path)
        assert code == 400 and "Set-Cookie" not in headers, (path, code, headers)
        assert "#token=TOKEN" in json.loads(body)["error"] and TOKEN.encode() not in body
    cookie = {"Cookie": f"jobd_token={TOKEN}"}
    assert request(port, "/api/overview", headers=cookie)[0] == 401
    acting = {**csrf(port), "Cookie": f"jobd_token={TOKEN}"}
    del acting["Authorization"]
    assert request(port, "/api/dead-letters/purge", "POST", acting, b'{"queue": "q"}')[0] == 401
    # The page and its files hold no data: they load without the token, and set nothing.
    for path in ("/", "/static/dashboard.js", "/static/dashboard.css"):
        code, headers, _ = request(port, path)
        assert code == 200 and "Set-Cookie" not in headers, path
        assert headers["Referrer-Policy"] == "no-referrer"
    code, _, body = request(port, "/api/overview", headers=bearer)
    assert code == 200 and json.loads(body)["queues"]["q"]


# -- what held in the review still holds ---------------------------------------------------------


def test_static_files_csrf_and_headers_still_hold(
    r: redis.Redis, write_config, tmp_path: Path, dashboard
) -> None:
    port, _ = dashboard(with_token(write_config, tmp_path))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for path in (
        "/static/../dashboard.py",
        "/static/%2e%2e/config.py",
        "/static/",
        "/web/index.html",
    ):
        assert request(port, path, headers=bearer)[0] == 404, path
    code, headers, _ = request(port, "/", headers=bearer)
    assert code == 200 and headers["X-Content-Type-Options"] == "nosniff"
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    purge = b'{"queue": "q"}'
    assert request(port, "/api/dead-letters/purge", "POST", bearer, purge)[0] == 403
    wrong = {**bearer, "X-Jobd-CSRF": "0" * 64}
    assert request(port, "/api/dead-letters/purge", "POST", wrong, purge)[0] == 403


def test_garbage_in_the_minute_counters_does_not_break_the_overview(r, write_config) -> None:
    """A counter hash someone else wrote into (`{S}:stats:M`, `{S}:timings:M`) must not turn
    the overview into a 500: a value that is not a count counts 0."""
    from jobd.config import load
    from jobd.store import figures

    config = load(
        str(write_config("redis: {url: '{redis}'}\nqueues:\n  q: {command: [/bin/true]}\n"))
    )
    q = config.queues["q"]
    minute = int(time.time() // 60)
    r.hset(q.keys.stats(minute), mapping={"done": "lots", "failed": "3"})
    r.hset(q.keys.timings(minute), mapping={"wait:1": "x", b"\xff:2": "1", "run:0": "2"})
    hour = figures.last_hour(r, q, now=minute * 60)
    assert hour["series"]["done"][-1] == 0 and hour["series"]["failed"][-1] == 3
