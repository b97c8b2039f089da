"""The Lua scripts in ``jobd/lua/``, registered on a client; each file's header documents the
keys it touches and its reply."""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script

NAMES = (
    "renew", "settle", "reclaim", "dead_letter", "drop_consumer",
    "retry", "schedule", "promote", "delayed_list", "requeue", "trim",
)  # fmt: skip


@cache
def source(name: str) -> str:
    return resources.files("jobd").joinpath("lua", f"{name}.lua").read_text("utf-8")


class Scripts:
    """Every script, bound to one client. redis-py's Script re-loads on NOSCRIPT (normal after
    a restart or a failover: SCRIPT LOAD is not replicated from Redis 7.0)."""

    renew: Script
    settle: Script
    reclaim: Script
    dead_letter: Script
    drop_consumer: Script
    retry: Script
    schedule: Script
    promote: Script
    delayed_list: Script
    requeue: Script
    trim: Script

    def __init__(self, client: redis.Redis) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))
