"""Several I/O lanes per ``SqlStore`` on PostgreSQL (``Database.max_lanes``): concurrent reads
go to several connections and their round trips overlap; several write batches of one event
loop are in flight at once, each run's writes still in the order it issued them; SQLite keeps
one lane of each kind. The link is a ``NetProxy`` adding a delay, so that calls overlap for
certain; the assertions count lanes, connections and calls in flight, never time."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from store_kit import T0, fired, first_events, mk

from flowkit import RunStatus
from flowkit.events import RunCompleted
from flowkit.stores.base import Update
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql._group_commit import GroupCommit
from flowkit_testing._netproxy import NetProxy

DELAY = 0.02  # seconds added each way: a call takes at least 40 ms, so concurrent ones overlap


class InFlight:
    """Counts the calls of a wrapped function running at once on the lanes' threads."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.threads: dict[str, int] = {}  # calls per thread
        self._lock = threading.Lock()

    def wrap(self, fn: Any) -> Any:
        def wrapped(*args: Any, **kw: Any) -> Any:
            with self._lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
                name = threading.current_thread().name
                self.threads[name] = self.threads.get(name, 0) + 1
            try:
                return fn(*args, **kw)
            finally:
                with self._lock:
                    self.now -= 1

        return wrapped


@pytest.mark.postgres
async def test_concurrent_reads_overlap_on_several_connections(
    proxied: tuple[NetProxy, str],
) -> None:
    proxy, url = proxied
    store = SqlStore(url)
    try:
        db = store._db
        assert db.max_lanes == {"write": 4, "read": 4}
        runs = [mk(f"r{i}", t=T0 + i) for i in range(8)]
        await asyncio.gather(*(store.create_run(r, first_events(r)) for r in runs))
        proxy.delay = DELAY
        reads = InFlight()
        db.run_read = reads.wrap(db.run_read)  # type: ignore[method-assign]
        got = await asyncio.gather(*(store.get_run(r.id) for r in runs))
        assert [g.id for g in got if g is not None] == [r.id for r in runs]
        lanes = db.lanes("read")
        # four lanes, each ran two of the eight reads: two round trips in a row, not eight
        assert len(lanes) == 4 and len(reads.threads) == 4 and reads.peak >= 2
        assert sorted(reads.threads.values()) == [2, 2, 2, 2]
        assert sorted(reads.threads) == sorted(lane.name for lane in lanes)
        # each lane on a connection (a server session) of its own
        pids = {lane.conn.dbapi.info.backend_pid for lane in lanes if lane.conn is not None}
        assert len(pids) == 4
        # a lone read afterwards takes an idle lane: no fifth one
        assert await store.get_run("r0") is not None
        assert len(db.lanes("read")) == 4
    finally:
        store.close()


@pytest.mark.postgres
async def test_two_write_batches_fly_at_once_and_each_run_keeps_its_order(
    proxied: tuple[NetProxy, str],
) -> None:
    proxy, url = proxied
    store = SqlStore(url)
    n = 2 * GroupCommit.SPLIT  # two full batches at once
    try:
        proxy.delay = DELAY
        batches = InFlight()
        gc = store._gc
        gc.run_batch = batches.wrap(gc.run_batch)  # type: ignore[method-assign]

        async def life(i: int) -> None:
            run = mk(f"w{i:02d}", t=T0)
            assert (await store.create_run(run, first_events(run)))[1]
            assert await store.claim(run.id, "w", T0 + 1, T0 + 60) is not None
            for step in range(3):
                seqs = await store.append_events(run.id, "w", T0 + 2, [fired(T0 + 2, str(step))])
                assert seqs is not None
            done = Update(status=RunStatus.COMPLETED, events=[RunCompleted(at=T0 + 3)])
            await store.commit(run.id, "w", T0 + 3, done)

        await asyncio.gather(*(life(i) for i in range(n)))
        assert batches.peak >= 2 and len(batches.threads) >= 2  # on two write lanes at once
        assert 2 <= len(store._db.lanes("write")) <= 4
        for i in range(n):
            rid = f"w{i:02d}"
            run = await store.get_run(rid)
            assert run is not None and run.status == RunStatus.COMPLETED
            events = await store.load_events(rid)
            # the run's writes in the order it issued them: its first events, the three
            # timers in step order, the completion; seqs without a gap
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            timers = [e.pos for e in events if e.type == "timer_fired"]
            assert timers == ["0", "1", "2"]
            assert events[-1].type == "run_completed"
    finally:
        store.close()


async def test_sqlite_keeps_one_lane_of_each_kind(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'one.db'}")
    try:
        db = store._db
        assert db.max_lanes == {"write": 1, "read": 1}
        runs = [mk(f"s{i}", t=T0 + i) for i in range(2 * GroupCommit.SPLIT)]
        await asyncio.gather(*(store.create_run(r, first_events(r)) for r in runs))
        got = await asyncio.gather(*(store.get_run(r.id) for r in runs))
        assert all(g is not None for g in got)
        assert len(db.lanes("write")) == 1 and len(db.lanes("read")) == 1
        # one writer per file: the concurrent writes went as one batch, not split
        assert db.stats["batches"] == 1 and db.stats["batched_ops"] == len(runs)
    finally:
        store.close()
