"""Review 36o of issue 36: the producer-only ACL user that d53cf0b documents (docs/operations/
redis.md, "A producer-only user": ``ACL SETUSER producer on >PW ~jobd:* resetchannels -@all
+xadd``) "cannot read or delete jobs", the docs say, and docs/security.md's threat model rests
on it. It can delete them: ``XADD`` takes ``MAXLEN``/``MINID`` and trims the stream as it adds
(Redis ACLs cannot forbid an argument), ignoring consumer groups (trim.lua's own header says so
of ``XTRIM``: before Redis 8.2 it removes pending and undelivered entries alike).

Reproduced as that very user: three jobs enqueued, a daemon holding one; one ``XADD jobd:q
MAXLEN = 1 * …`` from the producer, and the two waiting jobs are gone (never run, never
dead-lettered, no record), the running one's entry too (its pending record stays, its fields
gone).

What should happen: the docs say what such a user can do: delete any undelivered or pending
job of the queues it may write (``MAXLEN``/``MINID``), so a producer-only user is no defence
against a hostile producer deleting others' jobs, only against it making groups and consumers.
(Redis 7.0 has no ACL rule on an argument; a wrapper script, ``+evalsha`` of one loaded script
doing ``XADD … *`` alone, would be the enforced alternative.)
"""

from __future__ import annotations

from pathlib import Path

import redis
from support import RedisServer

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "docs").is_dir())
DOCS = ROOT / "docs" / "operations" / "redis.md"


def test_the_producer_only_user_deletes_jobs(r: redis.Redis, redis_server: RedisServer) -> None:
    text = DOCS.read_text()
    section = text[text.index("### A producer-only user") :]
    section = section[: section.index("\n#", 1)] if "\n#" in section[1:] else section
    rule = "ACL SETUSER producer on >PW ~jobd:* resetchannels -@all +xadd"
    assert rule in section, "the documented user"
    r.execute_command(*rule.replace(">PW", ">pw-36o").split())
    producer = redis.Redis(port=redis_server.port, username="producer", password="pw-36o")
    try:
        r.xgroup_create("jobd:q", "jobd", id="0", mkstream=True)
        running = r.xadd("jobd:q", {"payload": "p", "job_id": "running"})
        r.xadd("jobd:q", {"payload": "p", "job_id": "waiting-1"})
        r.xadd("jobd:q", {"payload": "p", "job_id": "waiting-2"})
        r.xreadgroup("jobd", "host-1-abcdabcdabcdabcd", {"jobd:q": ">"}, count=1)
        producer.xadd("jobd:q", {"payload": "mine"}, maxlen=1, approximate=False)
        left = [fields[b"payload"] for _, fields in r.xrange("jobd:q")]
        assert left == [b"mine"], left  # the three jobs are gone
        assert r.xpending("jobd:q", "jobd")["pending"] == 1  # its record, not its entry
        assert not r.xrange("jobd:q", running, running)
    finally:
        producer.close()
        r.acl_deluser("producer")
    assert "cannot read or delete jobs" not in " ".join(section.split()), (
        "the producer-only user deleted two waiting jobs and a running one's entry with one "
        "XADD … MAXLEN = 1, where docs/operations/redis.md says it 'cannot read or delete jobs'"
    )
