"""Run ids in code-point order on a PostgreSQL database whose collation is a language's.

The test server is initdb'd ``--locale=C``, whose order is code points: these tests create
their databases with the ICU locale ``en-US`` (``pg.collated_database``), which orders
``é1, b1, Z1, a1, B1`` as ``a1, b1, B1, é1, Z1`` where Python (MemoryStore, SQLite, the
``flowkit.singleton`` helpers) says ``B1, Z1, a1, b1, é1``. Every ordering of run ids (FIFO
ties of admission and release, ``list_runs``, ``due_runs``, the row locks of a batch) must be
the code-point one there too; a database created before the run-id columns were declared
``COLLATE "C"`` is migrated on first use; and the hot queries keep their indexes."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from singleton_kit import holders, inp, make_lane
from store_kit import collated_database

from flowkit import ADMITTED_TAG, Run, RunStatus
from flowkit.events import RunCompleted, RunStarted, SingletonReleased
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores.base import Notify, Update
from flowkit.stores.sql._postgres import LOCK_ROWS_SQL, PgStatements
from flowkit.stores.sql._schema import SCHEMA_VERSION
from flowkit_testing import TestEnv
from flowkit_testing.conformance import CHECKS

pytestmark = pytest.mark.postgres

T0 = 1_767_225_600.0
TAG = "singleton:k"
STARTED = ["é1", "b1", "Z1", "a1", "B1"]  # the start order, all at one instant
CODE_POINTS = ["B1", "Z1", "a1", "b1", "é1"]
EN_US = ["a1", "b1", "B1", "é1", "Z1"]  # what the database's own collation says
RUN_ID_COLUMNS = (
    ("flowkit_runs", "id"),
    ("flowkit_events", "run_id"),
    ("flowkit_signals", "run_id"),
)


def _database_order(url: str, words: list[str]) -> list[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            got = conn.execute(
                sa.text("SELECT array_agg(w ORDER BY w) FROM unnest(CAST(:w AS text[])) AS w"),
                {"w": words},
            ).scalar_one()
    finally:
        engine.dispose()
    return list(got)


@pytest.fixture
def icu_url(pg_server: str) -> str:
    """A fresh database collating by ICU ``en-US``; the test's premise is checked."""
    url = collated_database(pg_server)
    assert sorted(STARTED) == CODE_POINTS
    assert _database_order(url, STARTED) == EN_US
    return url


@pytest.fixture
def store(icu_url: str) -> Iterator[SqlStore]:
    s = SqlStore(icu_url)
    yield s
    s.close()


def _run(rid: str, *, t: float = T0, admitted: bool = False, **kw: Any) -> Run:
    tags = (TAG, ADMITTED_TAG) if admitted else (TAG,)
    return Run(
        id=rid, workflow="wf", workflow_version="1", status=kw.pop("status", RunStatus.SUSPENDED),
        input={"id": rid}, tags=tags, created_at=t, updated_at=t, singleton_key="k",
        wake_at=kw.pop("wake_at", T0 + 60), **kw,
    )  # fmt: skip


async def _put(s: SqlStore | MemoryStore, run: Run) -> None:
    start = RunStarted(at=run.created_at, workflow="wf", version="1", input=run.input)
    _, created = await s.create_run(run, [start])
    assert created


def _release(now: float, notify: Notify) -> Update:
    return Update(
        events=[SingletonReleased(key="k", at=now), RunCompleted(output=None, at=now)],
        status=RunStatus.COMPLETED,
        output=None,
        notify=notify,
    )


# -- the example, through the engine -------------------------------------------------


async def test_fifo_ties_are_admitted_in_code_point_order_on_an_icu_database(
    store: SqlStore,
) -> None:
    """A holder, then ``é1, b1, Z1, a1, B1`` started at the same instant: the slot goes to
    ``B1, Z1, a1, b1, é1`` (as on MemoryStore and SQLite), not in the database's order."""
    lane = make_lane()
    async with TestEnv([lane], store=store) as env:
        await env.start("lane", inp("A", "signal"), "holder")
        for rid in STARTED:  # no time passes between the starts
            await env.start("lane", inp("A", "signal"), rid)
        assert len({(await env.get_run(r)).created_at for r in STARTED}) == 1
        admitted = []
        current = "holder"
        for _ in STARTED:
            await env.signal(current, "go")
            (current,) = await holders(env)
            admitted.append(current)
        assert admitted == CODE_POINTS
        assert lane.entered == ["holder", *CODE_POINTS]
        # list_runs: the tied runs in code-point order too
        listed = [r.id for r in await store.list_runs() if r.id != "holder"]
        assert listed == CODE_POINTS


# -- each store path, on the store ------------------------------------------------------------


ORDER_CHECKS = [
    "id_ties_by_code_point",
    "admission_ties_by_code_point",
    "admission_fifo_keeps_holders",
    "admission_respects_limit",
    "notify_wakes_oldest_waiters",
    "notify_hands_the_slot_over",
    "create_admission_is_fifo_behind_waiters",
    "list_runs_order_and_filters",
    "due_runs_and_next_due_at",
]


@pytest.mark.parametrize("name", ORDER_CHECKS)
async def test_the_ordering_conformance_checks_pass_on_an_icu_database(
    pg_server: str, name: str
) -> None:
    """The store conformance kit's checks of every order (FIFO admission, releases woken and
    handed over, ``list_runs``, ``due_runs``) on databases collating by ``en-US``."""
    opened: list[SqlStore] = []

    def make() -> SqlStore:
        opened.append(SqlStore(collated_database(pg_server)))
        return opened[-1]

    try:
        await CHECKS[name].run(make)
    finally:
        for s in opened:
            s.close()


@pytest.mark.parametrize("path", ["one statement", "general", "general, limit 2", "admission"])
async def test_every_admission_and_release_path_picks_the_code_point_first_waiter(
    icu_url: str, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The release in one statement (``PgStatements.release_fast``), the general release (its key's
    first waiters read by ``(created_at, id)``, then ``plan_release``), a release of one of
    two slots, and the worker's admission check all pick ``B1`` of the tied waiters, as
    MemoryStore does."""
    if path != "one statement":
        monkeypatch.setattr(PgStatements, "release_fast", lambda *a: None)
    limit = 2 if path == "general, limit 2" else 1
    found: dict[str, Any] = {}
    for name, s in (("pg", SqlStore(icu_url)), ("memory", MemoryStore())):
        try:
            await _put(s, _run("h", t=T0 - 2, admitted=True, status=RunStatus.RUNNING))
            if limit == 2:
                await _put(s, _run("h2", t=T0 - 1, admitted=True, status=RunStatus.RUNNING))
            for rid in STARTED:
                await _put(s, _run(rid))
            if path == "admission":  # the holder settles without notify: who gets the slot?
                await s.commit("h", None, T0 + 1, Update(status=RunStatus.COMPLETED))
                found[name] = [
                    r for r in STARTED if await s.try_admit_singleton(r, TAG, "wf", 1, T0 + 5)
                ]
                continue
            n = Notify("wf", TAG, limit, claim_owner="x", lease_expires=T0 + 90)
            res = await s.commit("h", None, T0 + 1, _release(T0 + 1, n))
            found[name] = [h.run.id for h in res.handed]
        finally:
            if isinstance(s, SqlStore):
                s.close()
    assert found["pg"] == found["memory"] == ["B1"]


async def test_a_batch_locks_its_rows_in_code_point_order(store: SqlStore) -> None:
    """A group commit with a release locks the rows it writes first, in one statement: in
    the code-point order in which the batch then sends its calls (Python sorts run ids so),
    or two batches could lock rows in a cycle."""
    for rid in STARTED:
        await _put(store, _run(rid))
    with store._db.tx() as conn:
        locked = [r[0] for r in conn.exec_driver_sql(LOCK_ROWS_SQL, {"ids": STARTED})]
    assert locked == sorted(STARTED) == CODE_POINTS


# -- a database created by an earlier flowkit -------------------------------------------------


def _collations(conn: sa.Connection) -> dict[tuple[str, str], str | None]:
    found = conn.exec_driver_sql(
        "SELECT table_name, column_name, collation_name FROM information_schema.columns"
        " WHERE table_schema = current_schema()"
    )
    cols = {(t, c): coll for t, c, coll in found}
    return {key: cols[key] for key in RUN_ID_COLUMNS}


def _as_an_earlier_flowkit_made_it(conn: sa.Connection) -> None:
    """Declare the run-id columns as an earlier flowkit did: without a collation (the
    database's own)."""
    for table, column in RUN_ID_COLUMNS:
        retype = 'TYPE VARCHAR(255) COLLATE "default"'
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} {retype}")


def _indexes(conn: sa.Connection) -> set[tuple[str, str, tuple[str, ...], bool]]:
    """The indexes of the tables with run ids (a partial index's predicate is re-parsed when
    the index is rebuilt: an equivalent text, not compared)."""
    inspect = sa.inspect(conn)
    return {
        (t, str(ix["name"]), tuple(str(c) for c in ix["column_names"]), bool(ix["unique"]))
        for t, _ in RUN_ID_COLUMNS
        for ix in inspect.get_indexes(t)
    } | {
        (t, "pk", tuple(inspect.get_pk_constraint(t)["constrained_columns"]), True)
        for t, _ in RUN_ID_COLUMNS
    }


async def test_a_database_of_an_earlier_flowkit_is_migrated_on_first_use(
    store: SqlStore, icu_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier flowkit declared the run-id columns without a collation (the database's
    ``en-US``). The first use by this flowkit declares them ``COLLATE "C"`` (keeping their
    data, their indexes and their schema version) and orders the runs by code point; the next
    open has nothing left to do."""
    for rid in STARTED:
        await _put(store, _run(rid))
    await store.deliver_signal("a1", "go", {"x": 1}, T0 + 1)
    events = {rid: await store.load_events(rid) for rid in STARTED}
    with store._db.tx() as conn:
        indexes = _indexes(conn)
        assert set(_collations(conn).values()) == {"C"}
        _as_an_earlier_flowkit_made_it(conn)
        assert set(_collations(conn).values()) == {None}
    store.close()

    fresh = SqlStore(icu_url)
    try:
        with caplog.at_level(logging.WARNING, logger="flowkit"):
            listed = [r.id for r in await fresh.list_runs()]
        assert listed == CODE_POINTS
        assert any('COLLATE "C"' in r.getMessage() for r in caplog.records)
        with fresh._db.tx(write=False) as conn:
            assert set(_collations(conn).values()) == {"C"}
            assert _indexes(conn) == indexes
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert version == str(SCHEMA_VERSION)
        assert {rid: await fresh.load_events(rid) for rid in STARTED} == events
        signal = await fresh.peek_signal("a1", "go")
        assert signal is not None and signal.payload == {"x": 1}
        assert await fresh.due_runs(T0 + 100, 10) == CODE_POINTS
    finally:
        fresh.close()

    caplog.clear()
    again = SqlStore(icu_url)
    try:
        with caplog.at_level(logging.WARNING, logger="flowkit"):
            assert await again.get_run("B1") is not None
        assert not [r for r in caplog.records if "COLLATE" in r.getMessage()]
    finally:
        again.close()


async def test_a_role_that_may_not_migrate_still_orders_by_code_point(
    store: SqlStore, icu_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A role that may read and write the tables but does not own them (a deployment whose
    migrations run as another role) cannot re-declare the columns: the store still opens,
    says what the owner should run, and still orders by code point (every query says
    ``COLLATE "C"``), in its releases too."""
    await _put(store, _run("h", t=T0 - 1, admitted=True, status=RunStatus.RUNNING))
    for rid in STARTED:
        await _put(store, _run(rid))
    url = sa.engine.make_url(icu_url)
    role = f"{url.database}_app"
    with store._db.tx() as conn:
        _as_an_earlier_flowkit_made_it(conn)
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        conn.exec_driver_sql(
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"'
        )
        conn.exec_driver_sql(f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    store.close()

    app = SqlStore(url.set(username=role).render_as_string(hide_password=False))
    try:
        with caplog.at_level(logging.WARNING, logger="flowkit"):
            assert [r.id for r in await app.list_runs()] == ["h", *CODE_POINTS]
        refused = [r.getMessage() for r in caplog.records if "not allowed" in r.getMessage()]
        assert len(refused) == 1 and 'COLLATE "C"' in refused[0], refused
        with app._db.tx(write=False) as conn:
            assert set(_collations(conn).values()) == {None}  # (unchanged)
        assert await app.due_runs(T0 + 100, 3) == ["h", *CODE_POINTS[:2]]
        n = Notify("wf", TAG, 1, claim_owner="x", lease_expires=T0 + 90)
        res = await app.commit("h", None, T0 + 1, _release(T0 + 1, n))
        assert [h.run.id for h in res.handed] == ["B1"]
        res = await app.commit("B1", "x", T0 + 2, _release(T0 + 2, Notify("wf", TAG, 1)))
        assert res.woken == ("Z1",)
    finally:
        app.close()


# -- the indexes still serve the order --------------------------------------------------------


def _plan(conn: sa.Connection, q: str, params: Any) -> list[str]:
    return [r[0] for r in conn.exec_driver_sql("EXPLAIN " + q, params)]


def _sorts_by_id(plan: list[str]) -> list[str]:
    """The plan's sorts on ``created_at`` or the run id (an index that cannot give the
    code-point order makes the planner sort the rows instead)."""
    return [line for line in plan if "Sort Key" in line and ("created_at" in line or "id" in line)]


@pytest.mark.parametrize("migrated", [False, True])
async def test_the_queue_and_list_reads_keep_their_indexes(
    store: SqlStore, icu_url: str, migrated: bool
) -> None:
    """On a database collating by ``en-US`` (created so, or migrated), the oldest waiter of a
    key is the first entry of ``ix_flowkit_runs_waiting`` (in the admission check's read and
    in the one-statement release) and ``list_runs`` walks ``ix_flowkit_runs_created``: no
    plan sorts the runs by ``(created_at, id)`` itself."""
    for i in range(300):
        await _put(store, _run(f"old{i:03d}", t=T0 - 1000 + i, status=RunStatus.COMPLETED))
    holder = _run("h", t=T0 - 1, admitted=True, status=RunStatus.RUNNING)
    await _put(store, dataclasses.replace(holder, lease_owner="x", lease_expires=T0 + 30))
    for rid in STARTED:
        await _put(store, _run(rid))
    if migrated:
        with store._db.tx() as conn:
            _as_an_earlier_flowkit_made_it(conn)
        store.close()
        store = SqlStore(icu_url)
        assert await store.get_run("h") is not None  # (the migration)
    try:
        sql = store._sql
        waiter_q = (f"{sql.waiters()} LIMIT 1", {"wf": "wf", "key": "k"})
        n = Notify("wf", TAG, 1, claim_owner="x", lease_expires=T0 + 90)
        fast = sql.release_fast("h", "x", T0 + 1, _release(T0 + 1, n))
        assert fast is not None
        listed: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, params: Any, *a: Any) -> None:
            if statement.lstrip().upper().startswith("SELECT") and "ORDER BY" in statement:
                listed.append((statement, params))

        sa.event.listen(store._db.engine, "before_cursor_execute", capture)
        try:
            assert [r.id for r in await store.list_runs(limit=3)] == [
                "old000",
                "old001",
                "old002",
            ]
        finally:
            sa.event.remove(store._db.engine, "before_cursor_execute", capture)
        assert len(listed) == 1
        with store._db.tx() as conn:
            conn.exec_driver_sql("ANALYZE")
            plans = {
                "waiter": _plan(conn, *waiter_q),
                "release": _plan(conn, fast[0], fast[1]),
                "list": _plan(conn, *listed[0]),
            }
        for name in ("waiter", "release"):
            assert any("ix_flowkit_runs_waiting" in line for line in plans[name]), plans[name]
        assert any("ix_flowkit_runs_created" in line for line in plans["list"]), plans["list"]
        assert {k: _sorts_by_id(p) for k, p in plans.items()} == {k: [] for k in plans}, plans
        res = await store.commit("h", "x", T0 + 1, _release(T0 + 1, n))
        assert [h.run.id for h in res.handed] == ["B1"]
    finally:
        store.close()


def test_the_run_id_columns_are_declared_in_code_point_order() -> None:
    """The schema: every run-id column is ``COLLATE "C"`` on PostgreSQL; SQLite's default
    ``BINARY`` already compares by code point."""
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateTable

    from flowkit.stores.sql import _schema
    from flowkit.stores.sql._schema import metadata

    assert RUN_ID_COLUMNS == _schema.RUN_ID_COLUMNS
    for table, column in RUN_ID_COLUMNS:
        ddl = str(CreateTable(metadata.tables[table]).compile(dialect=postgresql.dialect()))
        assert f'{column} VARCHAR(255) COLLATE "C" NOT NULL' in ddl, ddl
        lite = str(CreateTable(metadata.tables[table]).compile(dialect=sqlite.dialect()))
        assert "COLLATE" not in lite
