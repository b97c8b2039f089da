"""The storage layer: the only code that knows Redis's key layout, script arguments and replies.

``Store`` (``store.store``) is one client with every Lua script registered on it, and one typed
method per operation, grouped by area: reading (``reading``: ``ensure_group``, ``read_new``,
``read_levels``, ``reclaim``, ``keep``, ``dedupe``), outcomes (``outcomes``: ``settle`` for a
batch, each verb one script), leases and limits (``leases``: ``renew``, ``acquire``, ``bind``,
``leave``), the delayed set (``delayed``: ``schedule``, ``promote``, ``delayed_list``), upkeep
(``upkeep``: ``trim``, ``consumers``, ``drop_consumer``, ``tick``), and what operators and
producers do (``admin``: dead letters, ``requeue``, ``purge``, ``enqueue``). Each method builds
its KEYS and ARGV and parses its reply; no other module builds an argument list for a script.
Every client is made here (``Store.open``, on ``connection.client``). Keys are derived in
``keys``; the scripts sit in ``lua/``, each with its key layout in its header; ``status`` and
``figures`` read where a queue stands for ``jobd status``, the dashboard and the metrics.
"""
