"""The two lean releases, PostgreSQL's one statement (``PgStatements.release_fast``) and
SQLite's few statements (``SqliteStatements.release_lite``), against the general path.

The lean releases decide in SQL what ``rules.plan_release`` decides in Python for the
general path: who holds the key, which waiter is the oldest, whether it can be handed the
slot or only woken. Every path runs here on the same randomized key states (in namespaces of
one database per dialect): both lean releases, the general path on both dialects, and
MemoryStore. All must agree on everything: the result, every run row and every history."""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_kit import fresh_database

from flowkit import ADMITTED_TAG, Run, RunStatus
from flowkit.events import Event, RunCompleted, RunStarted, SingletonReleased
from flowkit.stores import MemoryStore
from flowkit.stores.base import CommitResult, Notify, Update
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql._postgres import PgStatements
from flowkit.stores.sql._sqlite import SqliteStatements

T0 = 1_767_225_600.0
NOW = T0 + 100
TAG = "singleton:k"
EXAMPLES = 150
SEED = 20261130


@pytest.fixture
def sqlite_stores(tmp_path: Path) -> Iterator[dict[str, SqlStore | MemoryStore]]:
    """SQLite twice (its lean release, and the general path, which the test selects by
    switching the lean one off), and MemoryStore (the rules in Python, over every run)."""
    lite = SqlStore(f"sqlite:///{tmp_path}/release.db")
    yield {
        "sqlite": lite,
        "sqlite general": SqlStore(lite.url, _view_of=lite),
        "memory": MemoryStore(),
    }
    lite.close()


@pytest.fixture
def stores(
    request: pytest.FixtureRequest, sqlite_stores: dict[str, SqlStore | MemoryStore]
) -> Iterator[dict[str, SqlStore | MemoryStore]]:
    """PostgreSQL twice as well (its one-statement release, and the general path)."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    pg = SqlStore(url)
    yield {"pg": pg, "pg general": SqlStore(url, _view_of=pg), **sqlite_stores}
    pg.close()


def _state(rng: random.Random) -> tuple[list[Run], str, Notify]:
    """A random key: the releasing holder ``h`` and up to five other runs of the key (any
    status, admitted or not, leased or not, with tied creation times), sometimes one of
    another workflow; the holder's lease, sometimes lost."""
    owner = "x" if rng.random() < 0.9 else "y"
    h = Run(
        id="h", workflow="wf", workflow_version="1", status=RunStatus.RUNNING,
        input={"i": 0}, tags=(TAG, ADMITTED_TAG), created_at=T0, updated_at=T0 + 1,
        singleton_key="k", lease_owner=owner, lease_expires=NOW + 30,
    )  # fmt: skip
    runs = [h]
    statuses = [
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.SUSPENDED,
        RunStatus.CANCELLING,
        RunStatus.BLOCKED,
        RunStatus.COMPLETED,
    ]
    for i in range(rng.randrange(6)):
        status = rng.choice(statuses)
        # (an admitted settled run: not what flowkit writes, but the rules read it too)
        admitted = rng.random() < (0.2 if status.active else 0.05)
        tags = (TAG, ADMITTED_TAG) if admitted else (TAG,)
        lease = rng.choice([(None, None), ("y", NOW + 50), ("y", NOW - 1), ("x", NOW + 5)])
        wf = "wf" if rng.random() < 0.9 else "other"
        runs.append(
            Run(
                id=f"r{i}",
                workflow=wf,
                workflow_version="1",
                status=status,
                input={"i": i + 1},
                tags=tags,
                created_at=T0 + rng.choice([1, 2, 2, 3]),
                updated_at=T0 + 4,
                wake_at=rng.choice([None, NOW + 60, NOW - 5]) if status.active else None,
                singleton_key="k",
                lease_owner=lease[0],
                lease_expires=lease[1],
            )
        )
    hand_offs = rng.choice([None, None, 1, 2])
    notify = Notify("wf", TAG, 1, claim_owner="x", lease_expires=NOW + 40, max_hand_offs=hand_offs)
    return runs, "x", notify


def _release(notify: Notify) -> Update:
    return Update(
        events=[SingletonReleased(key="k", at=NOW), RunCompleted(output={"ok": 1}, at=NOW)],
        status=RunStatus.COMPLETED,
        output={"ok": 1},
        notify=notify,
    )


def _plain(run: Run) -> Run:
    return dataclasses.replace(run, id=run.id.split(".", 1)[1], namespace=None)


def _outcome(got: Any) -> Any:
    if isinstance(got, BaseException):
        return type(got).__name__
    assert isinstance(got, CommitResult)
    return (
        _plain(got.run),
        got.seqs,
        tuple(w.split(".", 1)[1] for w in got.woken),
        tuple((_plain(h.run), h.events) for h in got.handed),
    )


async def _apply(
    store: SqlStore | MemoryStore, ns: str, runs: list[Run], owner: str, notify: Notify
) -> tuple[Any, list[tuple[Run, list[Event]]]]:
    s = store.scoped(ns)
    for r in runs:
        r = dataclasses.replace(r, id=f"{ns}.{r.id}")
        started = RunStarted(at=r.created_at, workflow=r.workflow, version="1", input=r.input)
        await s.create_run(r, [started])
    try:
        got: Any = await s.commit(f"{ns}.h", owner, NOW, _release(notify))
    except Exception as exc:
        got = exc
    after = []
    for r in runs:
        run = await s.get_run(f"{ns}.{r.id}")
        assert run is not None
        after.append((_plain(run), await s.load_events(f"{ns}.{r.id}")))
    return _outcome(got), after


async def _compare(
    stores: dict[str, SqlStore | MemoryStore], monkeypatch: pytest.MonkeyPatch
) -> collections.Counter[str]:
    """Every store on the same random key states: all agree with the first. How often each
    lean release was taken."""
    rng = random.Random(SEED)
    used: collections.Counter[str] = collections.Counter()

    owners: dict[str, Any] = {"release_fast": PgStatements, "release_lite": SqliteStatements}

    def counted(name: str) -> Any:
        real = getattr(owners[name], name)

        def count(self: Any, *a: Any) -> Any:
            got = real(self, *a)
            used[name] += got is not None
            return got

        return count

    lean = {name: counted(name) for name in ("release_fast", "release_lite")}
    kinds: set[Any] = set()
    first = next(iter(stores))
    for i in range(EXAMPLES):
        runs, owner, notify = _state(rng)
        got = {}
        for k, (name, store) in enumerate(stores.items()):
            for method, fn in lean.items():
                monkeypatch.setattr(
                    owners[method], method, (lambda *a: None) if "general" in name else fn
                )
            got[name] = await _apply(store, f"n{k}x{i}", runs, owner, notify)
        a = got[first]
        for name, b in got.items():
            assert b == a, f"example {i}, {name} against {first}: {runs}"
        res = a[0]
        kinds.add(res if isinstance(res, str) else (bool(res[2]), bool(res[3])))
    # every outcome came up: a lost lease, nobody to wake, a woken waiter, a handed one
    assert kinds >= {"LeaseLostError", (False, False), (True, False), (False, True)}
    return used


async def test_sqlites_lean_release_decides_as_the_general_path(
    sqlite_stores: dict[str, SqlStore | MemoryStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    used = await _compare(sqlite_stores, monkeypatch)
    assert used["release_lite"] >= EXAMPLES * 0.6  # (a lost lease falls back)


@pytest.mark.postgres
async def test_both_lean_releases_decide_as_the_general_paths(
    stores: dict[str, SqlStore | MemoryStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    used = await _compare(stores, monkeypatch)
    # (max_hand_offs=0 never occurs; a lost lease falls back)
    assert used["release_fast"] >= EXAMPLES * 0.6
    assert used["release_lite"] >= EXAMPLES * 0.6
