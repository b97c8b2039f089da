"""``Store``: every operation jobd makes on Redis, on one client (see the package docstring).

Each area is a mixin of its own module, all on ``StoreBase`` (the client, its scripts, the
consumer): ``reading`` (the group, reads, reclaims), ``leases`` (renewal, cluster-wide limits),
``outcomes`` (a batch of outcomes), ``outbox`` (follow-ups on a cluster), ``delayed`` (the
delayed set), ``upkeep`` (trim, consumer sweep, periodic ticks), ``admin`` (dead letters,
enqueue), ``control`` (pause, resume, cancel), ``history`` (a job's records, the running set,
the events: read only), ``registry`` (the daemons' heartbeats), ``browse`` (pages of a
queue's jobs for the dashboard) and ``workflows`` (dependencies and batches).
"""

from __future__ import annotations

from jobd.store.admin import AdminOps
from jobd.store.browse import BrowseOps
from jobd.store.control import CancelOps, ControlOps
from jobd.store.delayed import DelayedOps
from jobd.store.history import HistoryOps
from jobd.store.leases import LeaseOps
from jobd.store.outbox import OutboxOps
from jobd.store.outcomes import OutcomeOps
from jobd.store.reading import ReadingOps
from jobd.store.registry import RegistryOps
from jobd.store.upkeep import UpkeepOps
from jobd.store.workflows import WorkflowOps


class Store(
    ReadingOps,
    LeaseOps,
    OutcomeOps,
    OutboxOps,
    DelayedOps,
    UpkeepOps,
    AdminOps,
    ControlOps,
    CancelOps,
    HistoryOps,
    RegistryOps,
    BrowseOps,
    WorkflowOps,
):
    """One client, every script registered on it, one typed method per operation."""
