"""What every part of the store shares: one client, the scripts registered on it, and the
consumer name the daemon's operations act as."""

from __future__ import annotations

from typing import Self

import redis
from redis.cluster import RedisCluster

from jobd.config import RedisConfig
from jobd.store import connection, doorbell, keys
from jobd.store.scripts import Batch, Scripts


class StoreBase:
    def __init__(self, client: redis.Redis, consumer: str = "") -> None:
        self.client = client
        # A Redis Cluster's queues are in slots of their own: a job's follow-ups go through its
        # queue's outbox (store.outbox), never straight into their queues.
        self.cluster = isinstance(client, RedisCluster)
        self.scripts = Scripts(client)
        self.consumer = consumer  # '' for a command line tool, which holds no entry
        # reading.read_new's waits that timed out, by stream: the ids and when (see there)
        self._idle: dict[str, tuple[dict[str, str], float]] = {}
        # reading's waits (doorbell): another thread may cut them short (a daemon stopping)
        self.bell = doorbell.Bell()
        # reading.found_migrating: streams whose cluster slot was found migrating, and until
        # when (time.monotonic) their reads go key by key
        self._migrating: dict[str, float] = {}
        # outcomes.settle: the queues whose outbox its last call wrote workflow notices into
        self.noticed: set[str] = set()
        # outbox.move_follow_ups: by outbox, where its next call goes on (past failed moves)
        self._outbox_resume: dict[str, bytes] = {}
        # The max_payload in force of the on_dead_letter queues this store knows, by name
        # ('' none: ``WorkflowOps.know_hook``)
        self.payload_limits: dict[str, str] = {}
        # Redis's clock, which names the minute of the per-minute figures this store writes
        self.clock = connection.KeptClock(client)

    @classmethod
    def open(cls, config: RedisConfig, role: str, consumer: str = "") -> Self:
        """A store on a new client, named ``jobd-ROLE`` in CLIENT LIST."""
        return cls(connection.client(config, f"jobd-{role}"), consumer)

    def run(self, batch: Batch) -> list[object]:
        """Send ``batch`` in one round trip (one per node on a cluster); replies or errors."""
        return batch.run(self.client)

    def minute(self, key: str) -> int:
        """The minute of Redis's clock now, on the server holding ``key``: where the figures
        written now go (``QueueKeys.stats``, ``timings``)."""
        return keys.minute(self.clock.now(key))

    def refresh(self) -> None:
        """After Redis went away: drop connections so the next call finds the server again."""
        connection.refresh(self.client)
        self.clock.forget()

    def close(self) -> None:
        self.client.close()
