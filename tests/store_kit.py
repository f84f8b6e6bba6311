"""What the store tests share: the backends (MemoryStore, SqlStore on a SQLite file, on a
throwaway PostgreSQL), run builders, and the PostgreSQL helpers of ``tests/pg.py``.

The fixtures ``backend``, ``sql_backend`` and ``gc_backend`` (``conftest.py``) hand out a
``Backend``; everything else is imported from here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flowkit import Run, RunStatus
from flowkit.events import Event, RunCompleted, RunStarted, TimerFired
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores.base import Notify, Update
from flowkit.stores.codec import AESGCMCodec
from flowkit.stores.sql._postgres import PgStatements
from flowkit.stores.sql._sqlite import SqliteStatements

try:
    from pg import (
        PostgresUnavailable,
        collated_database,
        drop_database,
        fresh_database,
        start_postgres,
    )
except ImportError:  # tests/ imported as a package
    from tests.pg import (
        PostgresUnavailable,
        collated_database,
        drop_database,
        fresh_database,
        start_postgres,
    )

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
S = RunStatus
TAG = "singleton:k"
PG = pytest.param("postgres", marks=pytest.mark.postgres)
"""The PostgreSQL parameter of a backend fixture (needs the ``pg_server`` fixture)."""
KINDS = ["sqlite", PG]

__all__ = [
    "K1",
    "K2",
    "K3",
    "KINDS",
    "PG",
    "SECRET",
    "T0",
    "TAG",
    "Backend",
    "PostgresUnavailable",
    "S",
    "codec",
    "collated_database",
    "database_url",
    "delta",
    "drop_database",
    "fired",
    "first_events",
    "fresh_database",
    "gated",
    "gated_and_another",
    "general_releases",
    "make_backend",
    "mk",
    "put",
    "release",
    "secret_run",
    "start_postgres",
    "stats",
]


# -- backends ------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    store: Any
    url: str | None = None
    _opened: list[SqlStore] = field(default_factory=list)

    def another(self) -> Any:
        """A second, independent store object on the same data (another process' view)."""
        if self.url is None:
            return self.store
        s = SqlStore(self.url)
        self._opened.append(s)
        return s

    def scoped(self, namespace: str) -> Any:
        return self.store.scoped(namespace)

    def close(self) -> None:
        """Close the stores; drop a PostgreSQL database (the test is done with it)."""
        for s in [self.store, *self._opened]:
            if isinstance(s, SqlStore):
                s.close()
        if self.name == "postgres" and self.url is not None:
            drop_database(self.url)


def database_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database: a SQLite file in ``tmp_path``, or one on the test server."""
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'flowkit.db'}"
    return fresh_database(request.getfixturevalue("pg_server"))


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path, **kw: Any) -> Backend:
    if kind == "memory":
        return Backend("memory", MemoryStore())
    url = database_url(kind, request, tmp_path)
    return Backend(kind, SqlStore(url, **kw), url)


def stats(store: SqlStore) -> Any:
    """A copy of the store's counters (transactions, statements, batches)."""
    return store._db.stats.copy()


def delta(store: SqlStore, before: Any, key: str) -> int:
    return int(store._db.stats[key] - before[key])


def general_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn both lean releases off: every release takes the general path."""
    monkeypatch.setattr(PgStatements, "release_fast", lambda *a: None)
    monkeypatch.setattr(SqliteStatements, "release_lite", lambda *a: None)


# -- runs ----------------------------------------------------------------------------------


def mk(
    run_id: str,
    *,
    t: float = T0,
    wf: str = "wf",
    key: str | None = None,
    status: RunStatus = S.PENDING,
    tags: tuple[str, ...] = (),
    **kw: Any,
) -> Run:
    all_tags = ((f"singleton:{key}",) if key else ()) + tags
    return Run(
        id=run_id,
        workflow=wf,
        workflow_version="1",
        status=status,
        input={"n": 1, "name": run_id},
        tags=all_tags,
        created_at=t,
        updated_at=kw.pop("updated_at", t),
        singleton_key=key,
        **kw,
    )


def first_events(run: Run) -> list[Event]:
    return [
        RunStarted(
            seq=1,
            at=run.created_at,
            workflow=run.workflow,
            version="1",
            input=run.input,
            tags=list(run.tags),
        )
    ]


async def put(store: Any, run: Run, **kw: Any) -> Run:
    stored, created = await store.create_run(run, first_events(run), **kw)
    assert created
    return stored


def fired(at: float, pos: str = "0") -> TimerFired:
    return TimerFired(pos=pos, at=at)


async def gated(s: Any, holder_owner: str = "x") -> None:
    """Holder ``h`` admitted and leased to ``holder_owner``; waiters ``w1`` (oldest, the head
    of the queue: suspended until T0+50), ``w2`` gated behind it (suspended without a timer)."""
    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w2", key="k", t=T0 + 2))
    await put(s, mk("w1", key="k", t=T0 + 1))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    for rid in ("w1", "w2"):
        assert not await s.try_admit_singleton(rid, TAG, "wf", 1, T0 + 50)
    assert await s.claim("h", holder_owner, T0 + 2, T0 + 32)


async def gated_and_another(s: Any) -> None:
    """``gated``, and an unrelated run ``other`` leased to ``x``: a call to share the
    releasing batch with."""
    await gated(s)
    await put(s, mk("other"))
    assert await s.claim("other", "x", T0 + 2, T0 + 32)


def release(owner: str | None = "x", limit: int = 1) -> Update:
    """The holder's terminal commit at T0+3, handing its slot to ``owner``."""
    return Update(
        events=[RunCompleted(at=T0 + 3)],
        status=S.COMPLETED,
        notify=Notify("wf", TAG, limit, claim_owner=owner, lease_expires=T0 + 40),
    )


# -- CodecStore ----------------------------------------------------------------------------

SECRET = "TOP-SECRET-PAYLOAD-42"
K1 = bytes(range(32))
K2 = bytes(range(100, 116))  # AES-128
K3 = bytes(range(50, 74))  # AES-192


def codec(*keys: tuple[str, bytes]) -> AESGCMCodec:
    """An ``AESGCMCodec`` with ``keys`` (``k1``: ``K1`` by default)."""
    return AESGCMCodec(list(keys) or [("k1", K1)])


def secret_run(run_id: str, **kw: Any) -> Run:
    """A pending run whose input is ``SECRET``."""
    return Run(
        id=run_id,
        workflow="wf",
        workflow_version="1",
        status=RunStatus.PENDING,
        input={"s": SECRET},
        tags=("t1",),
        created_at=T0,
        updated_at=T0,
        **kw,
    )
