"""``prune_runs`` against a concurrent ``engine.retry`` of a parent on PostgreSQL (READ
COMMITTED): the prune's test "the parent is not active" must hold when it deletes the child,
not only on its snapshot. A transaction that re-opens the parent is left open while the prune
runs; the prune must wait for it and then keep the child."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from flowkit import RunStatus
from flowkit.stores import SqlStore

try:
    from store_kit import database_url, mk, put
except ImportError:  # tests/ imported as a package
    from tests.store_kit import database_url, mk, put

T0 = 1_000.0


async def test_a_prune_never_deletes_the_child_of_a_parent_a_retry_reopens(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = database_url("postgres", request, tmp_path)
    store = SqlStore(url)
    try:
        parent = dataclasses.replace(mk("p", t=T0), status=RunStatus.FAILED)
        child = dataclasses.replace(mk("c", t=T0), status=RunStatus.COMPLETED, parent_id="p")
        await put(store, parent)
        await put(store, child)
        retry = sa.create_engine(url)
        with retry.connect() as conn:
            # a retry of the parent in flight: its row updated, not committed yet
            conn.execute(sa.text("UPDATE flowkit_runs SET status = 'pending' WHERE id = 'p'"))
            pruning = asyncio.ensure_future(store.prune_runs(T0 + 10))
            # wait until the prune waits for the retry's row lock (no sleep as a stand-in:
            # the database says when a backend waits for a lock)
            deadline = time.monotonic() + 30
            waiting = sa.text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            with retry.connect() as watch:
                while True:
                    found = watch.execute(waiting).scalar()
                    watch.rollback()  # (the statistics are a snapshot per transaction)
                    if found:
                        break
                    assert not pruning.done(), "the prune did not wait for the parent"
                    assert time.monotonic() < deadline, "the prune never waited"
                    await asyncio.sleep(0.01)
            conn.commit()  # the retry lands: the parent is active again
        assert await asyncio.wait_for(pruning, 30) == 0
        assert await store.get_run("c") is not None  # the child of an active parent stays
        retry.dispose()
    finally:
        store.close()
