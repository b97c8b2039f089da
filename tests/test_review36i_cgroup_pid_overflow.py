"""Review 36i of issue 36: a cgroup named with a pid past any pid keeps every daemon from starting.

At its start a daemon ends the cgroups of daemons that are gone (``cgroup.Tree.remove_stale``,
called by ``Tree.take``): it takes the pid out of each ``jobd-<pid>-<token>-<n>`` name in its
cgroup root (``owners.pid_of``, made ASCII-digits-only by review 36h, but of any length) and,
when that daemon left no owner cgroup, asks the kernel whether the pid lives (``owners._alive``:
``os.kill(pid, 0)``). A pid past a C int (10 digits: ``jobd-9999999999-…``) raises
OverflowError there ("signed integer is greater than maximum"), which neither ``remove_stale``
(it suppresses OSError) nor the daemon's start (``Handlers.contain``: OSError alone) catches:
``jobd run`` dies, and so does every restart, for as long as the directory is there. Any process of the daemon's user may make it (a delegated root is that user's; handlers
run as that user unless ``run_as``): one ``mkdir`` by a job bricks the daemon, not a one-off kill.

What should happen: a name whose pid no process can have (past the kernel's pid_max, or past a C
int) is not a daemon's cgroup (``pid_of`` None, as for any other name) and is left alone; the
daemon starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobd.process.cgroup import Tree
from jobd.process.where import Found


# The OverflowError leaves remove_stale's scandir open: its warning is not the failure.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_cgroup_named_with_a_pid_past_any_pid_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "jobd-daemon").mkdir(parents=True)
    (root / "jobd-9999999999-0badc0de-1").mkdir()  # no owner cgroup beside it
    tree = Tree(Found(str(root), str(root / "jobd-daemon"), frozenset(), "cgroup: test"))
    tree.remove_stale()  # raised OverflowError: the daemon's start (Tree.take) with it
