"""What every part of the store shares: one client, the scripts registered on it, and the
consumer name the daemon's operations act as."""

from __future__ import annotations

from typing import Self

import redis

from jobd.config import RedisConfig
from jobd.store import connection
from jobd.store.scripts import Batch, Scripts


class StoreBase:
    def __init__(self, client: redis.Redis, consumer: str = "") -> None:
        self.client = client
        self.scripts = Scripts(client)
        self.consumer = consumer  # '' for a command line tool, which holds no entry

    @classmethod
    def open(cls, config: RedisConfig, role: str, consumer: str = "") -> Self:
        """A store on a new client, named ``jobd-ROLE`` in CLIENT LIST."""
        return cls(connection.client(config, f"jobd-{role}"), consumer)

    def run(self, batch: Batch) -> list[object]:
        """Send ``batch`` in one round trip (one per node on a cluster); replies or errors."""
        return batch.run(self.client)

    def refresh(self) -> None:
        """After Redis went away: drop connections so the next call finds the server again."""
        connection.refresh(self.client)

    def close(self) -> None:
        self.client.close()
