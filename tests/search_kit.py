"""Filling a SQL store with many runs and their search rows fast (bulk ``INSERT`` through
SQLAlchemy, no engine), for the plan tests of ``list_runs(search=...)`` and the bench."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from flowkit.stores import SqlStore
from flowkit.stores.sql._schema import runs, search

T0 = 1_767_225_600.0
CUSTOMERS = 1000
AMOUNTS = 5000
FILLED = 100_000
"""How many runs the ``filled_store`` fixture (``conftest.py``) holds."""


def run_row(i: int) -> dict[str, Any]:
    return {
        "id": f"r{i:06d}",
        "workflow": "wf",
        "workflow_version": "1",
        "status": "completed",
        "input": {"i": i},
        "output": {"ok": True},
        "error": None,
        "tags": [],
        "singleton_key": None,
        "admitted": False,
        "created_at": T0 + i,
        "updated_at": T0 + i,
        "namespace": None,
        "attempt": 1,
        "waiting_signals": [],
        "last_seq": 0,
        "recoveries": 0,
        "search": {"customer": f"c-{i % CUSTOMERS}", "amount": i % AMOUNTS},
    }


def fill(store: SqlStore, n: int, chunk: int = 10_000) -> None:
    """``n`` completed runs, each with two search attributes: ``customer`` (one of
    ``CUSTOMERS``) and ``amount`` (``i % AMOUNTS``); then ``ANALYZE`` (planner statistics).
    On PostgreSQL the rows go by ``COPY`` (a row at a time, ``executemany`` takes three
    times as long), encoded by the columns' own types as an ``INSERT`` would."""
    db = store._db
    with db.tx() as conn:
        for start in range(0, n, chunk):
            rows = [run_row(i) for i in range(start, min(n, start + chunk))]
            attrs = []
            for r in rows:
                rid, s = r["id"], r["search"]
                none = {"text": None, "num": None, "flag": None}
                attrs.append({**none, "run_id": rid, "name": "customer", "text": s["customer"]})
                attrs.append({**none, "run_id": rid, "name": "amount", "num": float(s["amount"])})
            for table, batch in ((runs, rows), (search, attrs)):
                if not _copy(conn, table, batch):
                    conn.execute(table.insert(), batch)
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))


def _copy(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> bool:
    """``rows`` into ``table`` by ``COPY ... FROM STDIN`` (psycopg 3 on PostgreSQL; else
    ``False``: nothing written), each value through its column's bind processor."""
    if conn.dialect.name != "postgresql" or conn.dialect.driver != "psycopg":
        return False
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    names = list(rows[0])
    procs = [table.c[k].type.bind_processor(conn.dialect) for k in names]
    columns = ", ".join(f'"{k}"' for k in names)
    with cursor.copy(f"COPY {table.name} ({columns}) FROM STDIN") as copy:
        for row in rows:
            values = [row[k] for k in names]
            copy.write_row(
                [v if p is None or v is None else p(v) for p, v in zip(procs, values, strict=True)]
            )
    return True


def plan(store: SqlStore, q: sa.Select[Any]) -> str:
    """The database's plan of ``q`` (``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN`` on
    PostgreSQL), one line per node."""
    db = store._db
    with db.engine.connect() as conn:
        c = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        params: Any = dict(c.params)
        if c.positional:
            params = tuple(c.params[k] for k in c.positiontup or ())
        prefix = "EXPLAIN QUERY PLAN " if db.dialect == "sqlite" else "EXPLAIN "
        rows = conn.exec_driver_sql(prefix + str(c), params).fetchall()
        return "\n".join(str(r[-1] if db.dialect == "sqlite" else r[0]) for r in rows)
