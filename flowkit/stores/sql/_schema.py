"""The SQL schema of ``SqlStore``: eight tables (runs, events, signals, meta, workers,
workflow schemas, search, schedules) and those of published events (waits, buffer, published
ids), indexes, the schema version, and the bootstrap that creates them once and migrates what
an older flowkit left (indexes added since, PostgreSQL run ids declared ``COLLATE "C"``, so
that ids order by code point, as Python compares them). The tables: docs/stores.md,
"SqlStore"."""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles

from ...errors import SchemaVersionError, StoreUnavailableError, UnsupportedDatabaseError

SCHEMA_VERSION = 4
"""The layout this code reads and writes; bump it (and add a migration) on any change."""

SCHEMA_VERSION_KEY = "schema_version"

log = logging.getLogger("flowkit")

TERMINAL_SQL = "('cancelled', 'completed', 'dead', 'failed')"
"""The terminal statuses as an SQL list (the predicate of ``ix_flowkit_runs_settled``)."""

WAITING_SQL = "status IN ('blocked', 'pending', 'running', 'suspended')"
"""A singleton waiter's status (``flowkit.singleton.waiters``: active, not cancelling), as
the predicate of ``ix_flowkit_runs_waiting``: a query that uses the index must carry exactly
this term (and ``admitted`` false), or the database cannot prove the index covers it."""


class _SQLiteJSON(sqlite.JSON):
    """JSON declared ``TEXT`` on SQLite. A column declared ``JSON`` gets NUMERIC affinity there,
    which stores the JSON text ``10.0`` as the integer 10: payloads would not round-trip (and
    the JSON parser would be handed a number instead of text)."""

    cache_ok = True


@compiles(_SQLiteJSON, "sqlite")
def _sqlite_json_ddl(type_: Any, compiler: Any, **kw: Any) -> str:
    return "TEXT"


def _json() -> Any:
    return sa.JSON().with_variant(JSONB(), "postgresql").with_variant(_SQLiteJSON(), "sqlite")


# Float64 everywhere: a double holds every microsecond-rounded epoch float exactly, so
# ``created_at`` (and every other instant) reads back bit for bit.
_TIME = sa.Double

# Run ids compare by code point (``COLLATE "C"``) on PostgreSQL, whatever the database's
# collation: an ICU or glibc locale would order ``B1`` after ``a1`` (and ``é1`` before ``Z1``),
# and FIFO ties would then follow the database's locale instead of the Python rules. All three
# run-id columns carry it, so their joins compare under one collation and keep their indexes.
RUN_ID = sa.String(255).with_variant(sa.String(255, collation="C"), "postgresql")
RUN_ID_COLUMNS = (
    ("flowkit_runs", "id"),
    ("flowkit_events", "run_id"),
    ("flowkit_signals", "run_id"),
)
"""The ``(table, column)`` of every run id: ``COLLATE "C"`` on PostgreSQL."""

BY_ID = {"postgresql": 'id COLLATE "C"', "sqlite": "id"}
"""The run id as an ``ORDER BY`` term, in code-point order on each dialect (explicit on
PostgreSQL, so the order never depends on how the column was declared)."""

# SQLite only autoincrements an ``INTEGER PRIMARY KEY`` (the rowid alias).
_BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

metadata = sa.MetaData()

runs = sa.Table(
    "flowkit_runs",
    metadata,
    sa.Column("id", RUN_ID, primary_key=True),
    sa.Column("workflow", sa.String(255), nullable=False),
    sa.Column("workflow_version", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("input", _json()),
    sa.Column("output", _json()),
    sa.Column("error", _json()),
    sa.Column("tags", _json(), nullable=False),
    sa.Column("singleton_key", sa.String(255)),
    sa.Column("admitted", sa.Boolean(), nullable=False, default=False),
    sa.Column("created_at", _TIME, nullable=False),
    sa.Column("updated_at", _TIME, nullable=False),
    sa.Column("wake_at", _TIME),
    sa.Column("namespace", sa.String(255)),
    sa.Column("attempt", sa.Integer(), nullable=False, default=1),
    sa.Column("lease_owner", sa.String(255)),
    sa.Column("lease_expires", _TIME),
    sa.Column("waiting_signals", _json(), nullable=False),
    # the seq of the run's last event: the next append needs no max(seq) query, and the row
    # is locked by every commit anyway
    sa.Column("last_seq", sa.Integer(), nullable=False, default=0),
    # since version 2: the execution_timeout's instant, and the count of lost activations
    sa.Column("deadline_at", _TIME),
    sa.Column("recoveries", sa.Integer(), nullable=False, default=0, server_default="0"),
    # since version 3: the run whose ctx.child started it (looked up by equality only: the
    # database's collation will do)
    sa.Column("parent_id", sa.String(255)),
    # since version 3: the successor a run continued as (``ctx.continue_as_new``)
    sa.Column("continued_as", sa.String(255)),
    # since version 4: the search attributes (``Run.search``; indexed in ``flowkit_search``)
    sa.Column("search", _json()),
    # due timers: the poller's scan of suspended/blocked runs by wake time
    sa.Index("ix_flowkit_runs_due", "status", "wake_at"),
    # singleton admission and queue caps read only the active runs of one key
    sa.Index("ix_flowkit_runs_singleton", "workflow", "singleton_key", "status"),
    # ... an admission check or a release its holders (admitted: active runs only) ...
    sa.Index("ix_flowkit_runs_queue", "workflow", "singleton_key", "admitted", "created_at", "id"),
    # ... and only its first waiters, in queue order: a key's settled runs (a long-lived key
    # gathers many) are not in this index, so finding them costs the same after a year
    sa.Index(
        "ix_flowkit_runs_waiting",
        "workflow",
        "singleton_key",
        "created_at",
        "id",
        postgresql_where=sa.text(f"admitted = false AND {WAITING_SQL}"),
        sqlite_where=sa.text(f"admitted = 0 AND {WAITING_SQL}"),
    ),
    # the leased runs (those in flight): the poller's next due instant reads them apart from
    # the parked ones (``Statements._next_due``). Partial: a parked run is not in it
    sa.Index(
        "ix_flowkit_runs_leased",
        "lease_expires",
        postgresql_where=sa.text("lease_owner IS NOT NULL"),
        sqlite_where=sa.text("lease_owner IS NOT NULL"),
    ),
    # list_runs order
    sa.Index("ix_flowkit_runs_created", "created_at", "id"),
    # a version's runs (the claim of a worker that has some versions only, ``flowkit runs``)
    sa.Index("ix_flowkit_runs_version", "workflow", "workflow_version", "status"),
    # a run's children (cancelling a parent, ``list_runs(parent_id=...)``, ``flowkit show``)
    sa.Index("ix_flowkit_runs_parent", "parent_id"),
    # retention (``prune_runs``): settled runs by settlement. Partial: an active run's
    # ``updated_at`` moves with every commit, a settled one's hardly ever, so the hot path
    # never maintains it
    sa.Index(
        "ix_flowkit_runs_settled",
        "updated_at",
        postgresql_where=sa.text(f"status IN {TERMINAL_SQL}"),
        sqlite_where=sa.text(f"status IN {TERMINAL_SQL}"),
    ),
)

events = sa.Table(
    "flowkit_events",
    metadata,
    sa.Column("run_id", RUN_ID, primary_key=True),
    sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("at", _TIME, nullable=False),
    sa.Column("body", _json(), nullable=False),
)

signals = sa.Table(
    "flowkit_signals",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),
    sa.Column("run_id", RUN_ID, nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("payload", _json()),
    sa.Index("ix_flowkit_signals_inbox", "run_id", "name", "id"),
    sqlite_autoincrement=True,  # ids are never reused after a consumed signal is deleted
)

meta = sa.Table(
    "flowkit_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(255), nullable=False),
)

# what each worker instance made known of itself (``base.RecordsWorkers``): an additive table,
# created on existing databases by ``create_all`` (no new schema version: an older flowkit
# never reads it). ``namespace`` is '' for a store without one.
workers = sa.Table(
    "flowkit_workers",
    metadata,
    sa.Column("namespace", sa.String(255), primary_key=True),
    sa.Column("instance_id", sa.String(255), primary_key=True),
    sa.Column("versions", _json(), nullable=False),
    sa.Column("last_seen", _TIME, nullable=False),
)

# the JSON schemas each worker records per ``(workflow, version)`` it runs
# (``base.RecordsSchemas``): its input's and declared messages', which processes without the
# code validate against (docs/updates.md). An additive table like ``flowkit_workers``, created
# on existing databases by ``create_all`` (no new schema version: an older flowkit never reads
# it); one row per workflow version, not per run. ``namespace`` is '' for a store without one.
workflow_schemas = sa.Table(
    "flowkit_workflow_schemas",
    metadata,
    sa.Column("namespace", sa.String(255), primary_key=True),
    sa.Column("workflow", sa.String(255), primary_key=True),
    sa.Column("version", sa.String(255), primary_key=True),
    sa.Column("document", _json(), nullable=False),
)

# durable schedules (``stores.schedules.KeepsSchedules``, ``engine.schedules``): an additive
# table like ``flowkit_workers`` (no new schema version: an older flowkit never reads it), one
# row per schedule, not per run (nothing to prune with runs; ``delete`` removes the row).
# ``next_fire`` is advanced by compare-and-set; ``namespace`` is '' for a store without one.
schedules = sa.Table(
    "flowkit_schedules",
    metadata,
    sa.Column("namespace", sa.String(255), primary_key=True),
    sa.Column("schedule_id", sa.String(255), primary_key=True),
    sa.Column("workflow", sa.String(255), nullable=False),
    sa.Column("cron", sa.String(255)),
    sa.Column("every", sa.Double),
    sa.Column("timezone", sa.String(255), nullable=False),
    sa.Column("input", _json()),
    sa.Column("overlap", sa.String(16), nullable=False),
    sa.Column("catchup_window", sa.Double, nullable=False),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("next_fire", _TIME, nullable=False),
    sa.Column("last_run_id", RUN_ID),
    sa.Column("created_at", _TIME, nullable=False),
    sa.Column("updated_at", _TIME, nullable=False),
    # the scan of due schedules, and the next tick
    sa.Index("ix_flowkit_schedules_due", "namespace", "paused", "next_fire"),
    # a worker's scan of the due schedules of its workflows (``due_schedules(workflows=)``):
    # not a walk past the due schedules of workflows it does not run (nobody advances them
    # while their workers are down); added since the table (created on first use)
    sa.Index("ix_flowkit_schedules_workflow", "namespace", "paused", "workflow", "next_fire"),
)

# Published events (``base.PublishesEvents``, ``_events``): additive tables, created on
# existing databases by ``create_all`` (no new schema version). ``namespace`` is '' for a store
# without one. ``flowkit_event_waits`` holds a row per ``ctx.wait_for_event`` registered (and,
# once one came, the event delivered to it): per-run rows, pruned with their run.
# ``flowkit_event_buffer`` (events nobody waited for) and ``flowkit_published_events`` (the
# ``event_id`` dedupe) are pruned by age.
event_waits = sa.Table(
    "flowkit_event_waits",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),  # (the waiting order)
    sa.Column("run_id", RUN_ID, nullable=False),
    sa.Column("pos", sa.String(255), nullable=False),
    sa.Column("namespace", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("match", _json(), nullable=False),
    sa.Column("event_id", sa.String(255)),  # (NULL: still waiting)
    sa.Column("payload", _json()),
    sa.Column("mark", sa.BigInteger),  # (the inbox signal of the delivery)
    sa.Column("keys", _json()),  # (the delivered event's: to offer it again if dropped)
    sa.UniqueConstraint("run_id", "pos", name="uq_flowkit_event_waits_pos"),
    sa.Index("ix_flowkit_event_waits_name", "namespace", "name", "id"),
    sqlite_autoincrement=True,
)
event_buffer = sa.Table(
    "flowkit_event_buffer",
    metadata,
    sa.Column("id", _BIGID, primary_key=True, autoincrement=True),  # (oldest first)
    sa.Column("namespace", sa.String(255), nullable=False),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("event_id", sa.String(255), nullable=False),
    sa.Column("keys", _json(), nullable=False),
    sa.Column("payload", _json()),
    sa.Column("at", _TIME, nullable=False),
    sa.Index("ix_flowkit_event_buffer_name", "namespace", "name", "id"),
    sa.Index("ix_flowkit_event_buffer_at", "at"),
    sqlite_autoincrement=True,
)
published_events = sa.Table(
    "flowkit_published_events",
    metadata,
    sa.Column("namespace", sa.String(255), primary_key=True),
    sa.Column("event_id", sa.String(255), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("at", _TIME, nullable=False),
    sa.Index("ix_flowkit_published_events_at", "at"),
)
# the search attributes of each run (``Run.search``, docs/search-and-retention.md), one row per
# attribute, its value in the column of its kind (``_search_terms.kind_of``): ``text`` (str),
# ``num`` (int, float: a double), ``flag`` (bool). Written in the transaction that creates the run
# or commits its ``search_upserted``; ``list_runs(search=...)`` filters through these indexes
# (``_search_sql``). An additive table, created on existing databases by ``create_all``.
search = sa.Table(
    "flowkit_search",
    metadata,
    sa.Column("run_id", RUN_ID, primary_key=True),
    sa.Column("name", sa.String(64), primary_key=True),
    # (code-point order on PostgreSQL too, whatever the database's locale: ``<`` on strings
    # means what it means in Python, as for run ids)
    sa.Column("text", sa.String(255).with_variant(sa.String(255, collation="C"), "postgresql")),
    sa.Column("num", sa.Double),
    sa.Column("flag", sa.Boolean()),
    sa.Index("ix_flowkit_search_text", "name", "text", "run_id"),
    sa.Index("ix_flowkit_search_num", "name", "num", "run_id"),
    sa.Index("ix_flowkit_search_flag", "name", "flag", "run_id"),
)

PER_RUN_TABLES: tuple[sa.Table, ...] = (events, signals, search, event_waits)
"""Every table whose rows belong to one run (column ``run_id``): ``prune_runs`` deletes a
run's rows from each of them with the run. A new per-run table goes here."""

# Indexes added after version 1 first shipped, created on databases that lack them.
_ADDED_INDEXES = [
    ix
    for ix in runs.indexes
    if ix.name
    in (
        "ix_flowkit_runs_queue",
        "ix_flowkit_runs_waiting",
        "ix_flowkit_runs_version",
        "ix_flowkit_runs_parent",
        "ix_flowkit_runs_settled",
        "ix_flowkit_runs_leased",
    )
] + [ix for ix in schedules.indexes if ix.name == "ix_flowkit_schedules_workflow"]

# Columns added since version 1 (``_migrate``): ``ALTER TABLE flowkit_runs ADD COLUMN ...``.
_ADDED_COLUMNS = {
    2: ("deadline_at DOUBLE PRECISION", "recoveries INTEGER NOT NULL DEFAULT 0"),
    3: ("parent_id VARCHAR(255)", "continued_as VARCHAR(255)"),
    4: ("search {json}",),
}

# SQLite: an event inserted past its run's ``last_seq`` moves ``last_seq`` (and ``updated_at``)
# to it, so a step's record (``append_events``) is one ``INSERT`` statement. Every other write
# inserts events at seqs its own ``UPDATE`` of the run row already reserved: for them the
# trigger matches nothing, and a flowkit without it writes the same rows (additive).
SQLITE_LAST_SEQ_TRIGGER = (
    "CREATE TRIGGER IF NOT EXISTS flowkit_events_last_seq AFTER INSERT ON flowkit_events"
    " BEGIN UPDATE flowkit_runs SET last_seq = NEW.seq, updated_at = max(updated_at, NEW.at)"
    " WHERE id = NEW.run_id AND last_seq < NEW.seq; END"
)

# Two-int advisory lock space (distinct from the one-bigint space of the key locks).
_PG_SCHEMA_LOCK = (0x666C6F77, 1)


def ensure_schema(conn: sa.Connection) -> None:
    """Create the tables on first use and check the stored schema version.

    Runs inside the caller's write transaction (``BEGIN IMMEDIATE`` on SQLite, an advisory
    lock on PostgreSQL), so several processes opening a fresh database at once create it once.
    The version is read *before* anything is created: a newer database is left untouched."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(:a, :b)"),
            {"a": _PG_SCHEMA_LOCK[0], "b": _PG_SCHEMA_LOCK[1]},
        )
    found: int | None = None
    if sa.inspect(conn).has_table(meta.name):
        raw = conn.execute(
            sa.select(meta.c.value).where(meta.c.key == SCHEMA_VERSION_KEY)
        ).scalar_one_or_none()
        found = int(raw) if raw is not None else None
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaVersionError(found, SCHEMA_VERSION)
    if found is not None and found < SCHEMA_VERSION:
        _migrate(conn, found)
    metadata.create_all(conn, checkfirst=True)
    if found is not None:
        # Additive changes need no new schema version (an older flowkit reads the same
        # layout): indexes added since a database was created are created on first use.
        for index in _ADDED_INDEXES:
            index.create(conn, checkfirst=True)
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(SQLITE_LAST_SEQ_TRIGGER)  # (on existing databases too)
    else:
        _collate_run_ids(conn)
    if found is None:
        conn.execute(sa.insert(meta).values(key=SCHEMA_VERSION_KEY, value=str(SCHEMA_VERSION)))


def _migrate(conn: sa.Connection, found: int) -> None:
    """Bring a database of schema version ``found`` up to ``SCHEMA_VERSION``, in the schema
    check's locked transaction. Version 2 added the run deadline and the recovery count, and the
    ``dead`` status (which an older flowkit cannot read: it refuses a version-2 database)."""
    existing = {c["name"] for c in sa.inspect(conn).get_columns(runs.name)}
    for version in range(found + 1, SCHEMA_VERSION + 1):
        for column in _ADDED_COLUMNS.get(version, ()):
            if column.split()[0] not in existing:
                json_type = "JSONB" if conn.dialect.name == "postgresql" else "TEXT"
                column = column.format(json=json_type)
                conn.exec_driver_sql(f"ALTER TABLE {runs.name} ADD COLUMN {column}")
    conn.execute(
        sa.update(meta).where(meta.c.key == SCHEMA_VERSION_KEY).values(value=str(SCHEMA_VERSION))
    )
    log.warning(
        "flowkit: migrated the database schema from version %d to %d", found, SCHEMA_VERSION
    )


# PostgreSQL: each run-id column's type and collation, as the unqualified table names resolve
_PG_COLLATIONS = (
    "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), co.collname"
    " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
    " LEFT JOIN pg_collation co ON co.oid = a.attcollation WHERE NOT a.attisdropped AND ("
    + " OR ".join(f"(c.oid = to_regclass('{t}') AND a.attname = '{c}')" for t, c in RUN_ID_COLUMNS)
    + ")"
)


def _collate_run_ids(conn: sa.Connection) -> None:
    """PostgreSQL: declare every run-id column ``COLLATE "C"`` where a database created by an
    earlier flowkit left the database's default collation (a locale's order, not code points).

    An older flowkit does not notice (its statements read and write the same values, now in
    the order every other path uses), so the schema version stays 1. It runs once, in the
    schema check's locked transaction: the tables are not rewritten, but the indexes on these
    columns are rebuilt, with the three tables locked (in the order every transaction takes
    them: runs, events, signals) until it commits."""
    stale: dict[str, list[str]] = {}
    for table, column, type_, collation in conn.exec_driver_sql(_PG_COLLATIONS):
        if collation != "C":
            stale.setdefault(table, []).append(f'ALTER COLUMN {column} TYPE {type_} COLLATE "C"')
    if not stale:
        return
    tables = [t for t, _ in RUN_ID_COLUMNS]
    alters = [f"ALTER TABLE {t} {', '.join(stale[t])}" for t in tables if t in stale]
    try:
        with conn.begin_nested():  # (a refusal must not abort the schema check's transaction)
            conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
            for alter in alters:
                conn.exec_driver_sql(alter)
        log.warning(
            'flowkit: declared the run-id columns of %s COLLATE "C" (code-point order), once',
            ", ".join(t for t in tables if t in stale),
        )
    except sa.exc.DBAPIError as exc:
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        if code != "42501":  # insufficient_privilege: a role that does not own the tables
            raise
        # every query orders by ``id COLLATE "C"`` anyway: only the indexes cannot give
        # that order (the database sorts a key's first waiters instead)
        log.warning(
            "flowkit: not allowed to change the run-id columns (%s); runs are still ordered"
            " by code point, but the table owner should run: %s",
            exc.orig,
            "; ".join(alters),
        )


__all__ = [
    "BY_ID",
    "PER_RUN_TABLES",
    "RUN_ID",
    "RUN_ID_COLUMNS",
    "SCHEMA_VERSION",
    "SQLITE_LAST_SEQ_TRIGGER",
    "TERMINAL_SQL",
    "WAITING_SQL",
    "SchemaVersionError",
    "StoreUnavailableError",
    "UnsupportedDatabaseError",
    "ensure_schema",
    "event_buffer",
    "event_waits",
    "events",
    "meta",
    "metadata",
    "published_events",
    "runs",
    "search",
    "signals",
]
