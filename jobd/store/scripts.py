"""The Lua scripts in ``jobd/store/lua/``, registered on a client; each file's header documents the
keys it touches and its reply."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import (
    AskError,
    ClusterDownError,
    DataError,
    MovedError,
    NoScriptError,
    TryAgainError,
)

from jobd.store import connection as redisconn

# A cluster's answers that mean "not here, not now": the call did not run, so it is sent again
# through the cluster client, which follows the redirection.
_ELSEWHERE = (MovedError, AskError, TryAgainError, ClusterDownError)

NAMES = (
    "renew", "settle", "reclaim", "dead_letter", "drop_consumer",
    "retry", "schedule", "promote", "delayed_list", "requeue", "trim", "dedupe",
    "enqueue_unique", "tick", "acquire", "bind", "release", "read_levels", "observe", "keep",
    "purge", "dead_letters_shown", "pause", "resume", "cancel", "cancel_delayed", "cancelled",
    "start", "scheduled", "forget", "keep_marks", "cancel_waiting", "follow_up", "beat",
    "entries_shown", "delayed_shown", "recent", "wait_on", "hold", "unblock", "batch", "callback",
    "cancel_held", "expire_held", "running_shown", "events_shown", "hashes_shown",
    "job_shown", "unwait", "dead_letter_find", "record_copy", "lost_marks",
)  # fmt: skip


USES = "--! uses "
SENDABLE = frozenset((bytes, str, int, float))  # the types redis-py's Encoder takes as they are


@cache
def source(name: str) -> str:
    """The script as sent to Redis: ``lua/NAME.lua``, after the libraries its first line names
    (``--! uses LIB [LIB…]``, from ``lua/lib/``, in that order): Redis runs each script alone,
    so what several share is sent with each."""
    folder = resources.files("jobd.store").joinpath("lua")
    text = folder.joinpath(f"{name}.lua").read_text("utf-8")
    if text.startswith(USES):
        libs = text.split("\n", 1)[0].removeprefix(USES).split()
        text = "".join(folder.joinpath("lib", lib).read_text("utf-8") for lib in libs) + text
    return text


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
    dedupe: Script
    enqueue_unique: Script
    tick: Script
    acquire: Script
    bind: Script
    release: Script
    read_levels: Script
    observe: Script
    keep: Script
    purge: Script
    pause: Script
    resume: Script
    cancel: Script
    cancel_delayed: Script
    cancel_waiting: Script
    cancelled: Script
    start: Script
    scheduled: Script
    forget: Script
    dead_letters_shown: Script
    keep_marks: Script
    follow_up: Script
    beat: Script
    entries_shown: Script
    delayed_shown: Script
    recent: Script
    wait_on: Script
    hold: Script
    unblock: Script
    batch: Script
    callback: Script
    cancel_held: Script
    expire_held: Script
    running_shown: Script
    events_shown: Script
    hashes_shown: Script
    job_shown: Script
    unwait: Script
    dead_letter_find: Script
    record_copy: Script
    lost_marks: Script

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Script:
        """Each script is registered on its first use: a store calls a few of them, and
        registering all of them (a SHA1 of each) cost 1.5 ms each time a store was made."""
        if name not in NAMES:
            raise AttributeError(name)
        script = self._client.register_script(source(name))
        setattr(self, name, script)
        return script


@cache
def sha(name: str) -> str:
    """The SHA1 of script ``name`` as sent (``source``), which EVALSHA names it by."""
    return hashlib.sha1(source(name).encode("utf-8")).hexdigest()


def call(client: redis.Redis | RedisCluster, name: str, keys: list[str], args: list[object]) -> Any:
    """One call of script ``name`` (not one of a store's: ``lua/NAME.lua``) on ``client``, by
    EVALSHA; loaded and called again where the server lacks it (NOSCRIPT). For the functions
    that are given a client, not a store: no Script object made for each call."""
    try:
        return client.evalsha(sha(name), len(keys), *keys, *args)
    except NoScriptError:
        client.script_load(source(name))
        return client.evalsha(sha(name), len(keys), *keys, *args)


def unsendable(values: tuple | list) -> str | None:
    """What of ``values`` (a call's keys and arguments) redis-py cannot encode, as its Encoder
    refuses it (a bool, None, a list, a dict: from someone else's JSON); None when nothing."""
    for value in values:
        if type(value) in SENDABLE:  # nearly every value: one look-up
            continue
        if isinstance(value, bool) or not isinstance(value, (*SENDABLE, bytearray, memoryview)):
            return f"a value of type {type(value).__name__}"
    return None


class Batch:
    """Script calls sent together in one round trip, their replies (or errors) in order.

    On a single server (or a Sentinel's master) that is one pipeline. redis-py's cluster
    pipeline refuses EVALSHA, so on a cluster it is one pipeline per node, to the node that
    holds each call's slot (a call's keys share one slot, see ``keys.py``); a call whose slot
    moved meanwhile is sent again through the cluster client. Each script jobd batches checks
    ownership before it writes, so a batch sent again after a lost connection does no harm.
    A call redis-py cannot encode (``unsendable``) is not sent: its reply is that DataError,
    where redis-py would refuse the whole pipeline.
    """

    def __init__(self) -> None:
        self.calls: list[tuple[Script, list[str], list[object]]] = []

    def add(self, script: Script, keys: list[str], args: list[object]) -> None:
        self.calls.append((script, keys, args))

    def run(self, client: redis.Redis | RedisCluster) -> list[object]:
        if not isinstance(client, RedisCluster):
            return self._pipeline(client, list(range(len(self.calls))))
        replies: list[object] = [None] * len(self.calls)
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        for i in range(len(self.calls)):
            node = redisconn.node_for(client, self.calls[i][1][0])
            by_node.setdefault(id(node), (node, []))[1].append(i)
        for node, indexes in by_node.values():
            for i, reply in zip(indexes, self._pipeline(node, indexes), strict=True):
                if isinstance(reply, _ELSEWHERE):
                    script, keys, args = self.calls[i]
                    reply = script(keys=keys, args=args, client=client)
                replies[i] = reply
        return replies

    def _pipeline(self, client: redis.Redis, indexes: list[int]) -> list[object]:
        """The calls at ``indexes`` in one pipeline of EVALSHA. redis-py's own way (a Script
        called on a pipeline) asks SCRIPT EXISTS first, one more round trip on every batch;
        here a script the server lacks (after a restart or a failover) comes back as NOSCRIPT,
        is loaded, and only those calls are sent again."""
        replies = self._send(client, indexes)
        again = [n for n, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if again:
            for script in {self.calls[indexes[n]][0] for n in again}:
                script.sha = client.script_load(script.script)
            resent = self._send(client, [indexes[n] for n in again])
            for n, reply in zip(again, resent, strict=True):
                replies[n] = reply
        return replies

    def _send(self, client: redis.Redis, indexes: list[int]) -> list[object]:
        """The calls at ``indexes`` in one pipeline; a call redis-py cannot encode
        (``unsendable``) is not sent, its reply that DataError. Looked for only when redis-py
        refuses the pipeline: it packs every call before it sends any, so nothing went."""
        try:
            return self._execute(client, indexes)
        except DataError:
            bad = {i: why for i in indexes
                   if (why := unsendable([*self.calls[i][1], *self.calls[i][2]]))}  # fmt: skip
            if not bad:
                raise
            sent = iter(self._execute(client, [i for i in indexes if i not in bad]))
            return [DataError(f"not sent: {bad[i]} (redis-py cannot encode it)") if i in bad
                    else next(sent) for i in indexes]  # fmt: skip

    def _execute(self, client: redis.Redis, indexes: list[int]) -> list[object]:
        if not indexes:
            return []
        pipe = client.pipeline(transaction=False)
        for i in indexes:
            script, keys, args = self.calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        return pipe.execute(raise_on_error=False)
