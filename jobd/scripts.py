"""The Lua scripts in ``jobd/lua/``, registered on a client; each file's header documents the
keys it touches and its reply."""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
from redis.commands.core import Script

NAMES = ("renew", "settle", "reclaim", "dead_letter", "drop_consumer")


@cache
def source(name: str) -> str:
    return resources.files("jobd").joinpath("lua", f"{name}.lua").read_text("utf-8")


class Scripts:
    """Every script, bound to one client. redis-py's Script re-loads on NOSCRIPT (normal after
    a restart or a failover: SCRIPT LOAD is not replicated from Redis 7.0)."""

    def __init__(self, client: redis.Redis) -> None:
        self.renew: Script = client.register_script(source("renew"))
        self.settle: Script = client.register_script(source("settle"))
        self.reclaim: Script = client.register_script(source("reclaim"))
        self.dead_letter: Script = client.register_script(source("dead_letter"))
        self.drop_consumer: Script = client.register_script(source("drop_consumer"))
