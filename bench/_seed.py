"""Seeding a SQL store with many runs fast, for the dashboard's benches: ``seed_runs(url, n)``
bulk-inserts ``n`` runs into the store's own tables (no engine, no events), a mix an operator
would browse:

* five workflows; statuses mostly settled (completed 70 %, failed 8 %, cancelled 3 %, dead
  1 %), the rest active (suspended, pending, running, blocked, cancelling);
* a ``tenant:tN`` tag on every run (20 tenants) and a search attribute ``amount`` on every
  tenth;
* ``created_at`` shared by three runs at a time (ties go by id);
* 3 % of the runs are singleton runs of workflow ``sync`` in 50 lanes (``acct-0`` ..
  ``acct-49``), each lane with one holder and a queue of waiters; ``acct-0`` has the deepest
  queue (half of the singleton runs: 1,500 of 100,000).

Reused to measure the dashboard over HTTP (the lead's time-to-first-byte bench).

``copy_runs(url, template, n, prefix)`` inserts ``n`` copies of one real run (its row and
its history, read back by ``read_template``): the million-run bench's settled and sleeping
runs."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowkit._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX
from flowkit.stores import SqlStore
from flowkit.stores.sql._schema import events, runs, search

T0 = 1_767_225_600.0
WORKFLOWS = ("orders", "billing", "emails", "reports")
SINGLETON_WF = "sync"
LANES = 50
DEEP_LANE = "acct-0"
# (status, per mille) of the plain runs
MIX = (
    ("completed", 700),
    ("failed", 80),
    ("cancelled", 30),
    ("dead", 10),
    ("suspended", 90),
    ("pending", 40),
    ("running", 30),
    ("blocked", 15),
    ("cancelling", 5),
)


def _status(i: int) -> str:
    slot = (i * 7919) % 1000  # (spread over the ids, not in runs of one status)
    for status, share in MIX:
        if slot < share:
            return status
        slot -= share
    return "completed"


def _row(i: int, n: int) -> dict[str, Any]:
    created = T0 + (i // 3) * 0.03
    row: dict[str, Any] = {
        "id": f"run-{i:07d}",
        "workflow": WORKFLOWS[i % len(WORKFLOWS)],
        "workflow_version": "1",
        "status": _status(i),
        "input": {"i": i},
        "output": None,
        "error": None,
        "tags": [f"tenant:t{i % 20}"],
        "singleton_key": None,
        "admitted": False,
        "created_at": created,
        "updated_at": created + 1.0,
        "wake_at": None,
        "namespace": None,
        "attempt": 1,
        "waiting_signals": [],
        "last_seq": 0,
        "recoveries": 0,
        "search": {"amount": i % 5000} if i % 10 == 0 else {},
    }
    if row["status"] == "suspended":
        row["wake_at"] = created + 3600.0
    if i % 100 < 3:  # a singleton run: 3 % of them, in LANES lanes
        k = i // 100
        lane = 0 if k % 2 == 0 else k % LANES
        key = f"acct-{lane}"
        row.update(
            workflow=SINGLETON_WF,
            singleton_key=key,
            tags=[SINGLETON_TAG_PREFIX + key],
            status="pending",
            wake_at=None,
        )
    return row


def seed_runs(url: str, n: int) -> None:
    """Fill the (new, empty) flowkit database at ``url`` with ``n`` runs (the mix above):
    bulk ``INSERT``s through SQLAlchemy in one transaction, then ``ANALYZE``. Each lane's
    oldest run holds its slot (admitted, running); the rest of its runs wait."""
    store = SqlStore(url)
    try:
        db = store._db
        db.ensure_schema()
        holders: set[str] = set()
        with db.tx() as conn:
            chunk = 10_000
            for start in range(0, n, chunk):
                rows = [_row(i, n) for i in range(start, min(n, start + chunk))]
                for r in rows:
                    key = r["singleton_key"]
                    if key is not None and key not in holders:
                        holders.add(key)
                        r.update(status="running", admitted=True, tags=[*r["tags"], ADMITTED_TAG])
                conn.execute(runs.insert(), rows)
                attrs = [
                    {
                        "run_id": r["id"],
                        "name": "amount",
                        "text": None,
                        "num": float(r["search"]["amount"]),
                        "flag": None,
                    }
                    for r in rows
                    if r["search"]
                ]
                if attrs:
                    conn.execute(search.insert(), attrs)
        with db.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))
    finally:
        store.close()


Template = tuple[dict[str, Any], list[dict[str, Any]]]
"""One run's row of ``flowkit_runs`` and its rows of ``flowkit_events``, as read back."""


def read_template(url: str, run_id: str) -> Template:
    """The rows a real run left in the store at ``url`` (to be copied by ``copy_runs``)."""
    store = SqlStore(url)
    try:
        with store._db.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).mappings().one()
            evs = conn.execute(
                sa.select(events).where(events.c.run_id == run_id).order_by(events.c.seq)
            )
            return dict(row), [dict(e) for e in evs.mappings()]
    finally:
        store.close()


Patch = Callable[[int, dict[str, Any], list[dict[str, Any]]], None]
"""Edits copy ``i``'s run row and event rows in place (a due time, an input)."""


def copy_runs(
    url: str, template: Template, n: int, prefix: str, patch: Patch | None = None
) -> float:
    """Insert ``n`` copies of ``template`` (ids ``{prefix}{i:07d}``, ``created_at`` spread
    over the template's 1 ms apart, histories included) in chunks of one transaction each,
    straight into the tables (no engine); returns the seconds it took. No ``ANALYZE``: call
    ``analyze(url)`` after the last batch."""
    run0, evs0 = template
    store = SqlStore(url)
    t0 = time.perf_counter()
    try:
        db = store._db
        db.ensure_schema()
        chunk = 5_000
        for start in range(0, n, chunk):
            run_rows: list[dict[str, Any]] = []
            ev_rows: list[dict[str, Any]] = []
            for i in range(start, min(n, start + chunk)):
                rid = f"{prefix}{i:07d}"
                shift = -1e-3 * (n - i)  # older than the template, in id order
                row = {**run0, "id": rid}
                row["created_at"] = run0["created_at"] + shift
                row["updated_at"] = run0["updated_at"] + shift
                evs = [{**e, "run_id": rid, "at": e["at"] + shift} for e in evs0]
                if patch is not None:
                    patch(i, row, evs)
                run_rows.append(row)
                ev_rows.extend(evs)
            with db.tx() as conn:
                conn.execute(runs.insert(), run_rows)
                conn.execute(events.insert(), ev_rows)
    finally:
        store.close()
    return time.perf_counter() - t0


def analyze(url: str) -> None:
    """``ANALYZE`` the database at ``url`` (fresh planner statistics after a bulk load)."""
    store = SqlStore(url)
    try:
        with store._db.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))
    finally:
        store.close()


__all__ = [
    "DEEP_LANE",
    "SINGLETON_WF",
    "WORKFLOWS",
    "Template",
    "analyze",
    "copy_runs",
    "read_template",
    "seed_runs",
]
