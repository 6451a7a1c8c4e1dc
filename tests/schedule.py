"""How ``make test`` spreads the suite over xdist workers (``-n N``): a scheduler of its own.

The unit of work is a *group*: the tests of a module that share an expensive module-scoped fixture (a trained
campaign, say) go to one worker together, so the fixture is made once; every other test is a group of its own
and goes to whichever worker is free. The costliest groups start first. The test SLURM cluster is shared with
care: at most :data:`SLURM_LANES` groups that use it run at a time, and a group marked ``alone`` (it changes the
cluster's limits or stops a node) runs only while no other group uses the cluster. Tests that need no cluster
run beside all of them.

Workers collect; the controller schedules. Each worker writes what it collected (node id -> group, kind) to the
file named by ``$SBENCH_TEST_SCHEDULE``, which the controller reads once every worker has collected.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SCHEDULE_ENV = "SBENCH_TEST_SCHEDULE"
SLURM_LANES = 2  # groups on the 2-node test cluster at a time: more only queue behind each other in SLURM
LOCAL, SLURM, ALONE = "local", "slurm", "alone"


def kind_of(item: pytest.Item) -> str:
    if item.get_closest_marker("alone") is not None:
        return ALONE
    if item.get_closest_marker("slurm") is not None or "slurm_cluster" in getattr(item, "fixturenames", ()):
        return SLURM
    return LOCAL


def write_plan(items: list[pytest.Item], group_of: dict[str, str]) -> None:
    """A worker's collection, for the controller: each node id's group and the kind of its group."""
    target = os.environ.get(SCHEDULE_ENV)
    if not target:
        return
    kinds: dict[str, str] = {}
    rank = {LOCAL: 0, SLURM: 1, ALONE: 2}
    for item in items:
        g, k = group_of[item.nodeid], kind_of(item)
        kinds[g] = max(kinds.get(g, LOCAL), k, key=rank.__getitem__)
    plan = {"groups": group_of, "kinds": kinds}
    tmp = Path(f"{target}.{os.getpid()}")
    tmp.write_text(json.dumps(plan))
    tmp.replace(target)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with sbench's groups, the collection's order, one group at a time per worker,
    and the cluster's lanes."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # the collection is already ordered, costliest first
        self._plan: dict[str, Any] | None = None

    def _read_plan(self) -> dict[str, Any]:
        if self._plan is None:
            self._plan = json.loads(Path(os.environ[SCHEDULE_ENV]).read_text())
        return self._plan

    def _split_scope(self, nodeid: str) -> str:
        return str(self._read_plan()["groups"].get(nodeid, nodeid))

    def _kind(self, scope: str) -> str:
        return str(self._read_plan()["kinds"].get(scope, LOCAL))

    def _running(self, besides: Any) -> list[str]:
        """The kinds of the groups assigned to workers other than *besides* and not finished. A worker runs its
        groups one after the other, so what it holds never overlaps what it is given next."""
        return [self._kind(scope) for node, work in self.assigned_work.items() if node is not besides
                for scope, tests in work.items() if not all(tests.values())]

    @staticmethod
    def _may_start(kind: str, running: list[str]) -> bool:
        if kind == LOCAL:
            return True
        if ALONE in running:
            return False
        if kind == ALONE:
            return SLURM not in running
        return running.count(SLURM) < SLURM_LANES

    def _next_scope(self, node: Any) -> str | None:
        running = self._running(node)
        scope = next((s for s in self.workqueue if self._may_start(self._kind(s), running)), None)
        if scope is None and self._pending_of(self.assigned_work[node]) == 1:
            # A worker keeps its last test until it is given more work (it runs a test knowing the next one), so
            # a worker left without work here would hold that test back: past the lanes, it takes the next group
            # that does not need the cluster to itself (more cluster jobs only queue in SLURM).
            scope = next((s for s in self.workqueue if self._kind(s) != ALONE), None)
        return scope

    def _assign_work_unit(self, node: Any) -> None:
        scope = self._next_scope(node)
        if scope is None:
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: Any) -> None:
        """Keep the worker's next group queued behind the one it runs (two tests pending at least, as xdist's own
        schedulers do), choosing groups the cluster's lanes allow."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            before = len(self.workqueue)
            self._assign_work_unit(node)
            if len(self.workqueue) == before:
                return  # nothing it may start now: asked again when any test ends

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # a group that ended may have opened a lane another worker waits for
            if other is not node:
                self._reschedule(other)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        queue: OrderedDict[str, dict[str, bool]] = OrderedDict()
        for nodeid in self.collection:
            queue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        self.workqueue = queue
        for node in self.nodes:
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()


class Plugin:
    """Registered by ``tests/conftest.py`` where xdist is loaded (its hook is unknown without it)."""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
        """``--dist loadgroup`` (make test): this module's groups, order and cluster lanes."""
        return GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None
