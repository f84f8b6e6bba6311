"""Row <-> ``Run``/``Event`` conversion and the SQL forms of the claim rules.

The claim rules live in ``flowkit.stores.memory`` (``claimable``, ``due_time``). A SQL store
cannot call Python inside ``UPDATE ... WHERE``, so ``claimable_sql`` and ``due_time_sql`` below
mirror them; every caller re-checks rows with the Python rules where it can, and
``tests/test_sql_store.py`` compares both forms on randomized run states against MemoryStore."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from ..._history import Event, event_from_json, event_to_json
from ..._run import ACTIVE_STATUSES, ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from ._schema import runs

R = runs.c
ACTIVE = sorted(s.value for s in ACTIVE_STATUSES)
_ALWAYS_CLAIMABLE = [RunStatus.PENDING.value, RunStatus.RUNNING.value]
_CANCELLING = RunStatus.CANCELLING.value


# -- conversion -------------------------------------------------------------------------
def to_run(row: sa.Row[Any]) -> Run:
    m = row._mapping
    return Run(
        id=m["id"],
        workflow=m["workflow"],
        workflow_version=m["workflow_version"],
        status=RunStatus(m["status"]),
        input=m["input"],
        output=m["output"],
        error=m["error"],
        tags=tuple(m["tags"] or ()),
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        wake_at=m["wake_at"],
        namespace=m["namespace"],
        singleton_key=m["singleton_key"],
        attempt=m["attempt"],
        lease_owner=m["lease_owner"],
        lease_expires=m["lease_expires"],
        waiting_signals=tuple(m["waiting_signals"] or ()),
    )


def run_values(run: Run) -> dict[str, Any]:
    """The row of ``run``; ``admitted`` is derived from the tags so the two never disagree."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": RunStatus(run.status).value,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "tags": list(run.tags),
        "singleton_key": run.singleton_key,
        "admitted": ADMITTED_TAG in run.tags,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "wake_at": run.wake_at,
        "namespace": run.namespace,
        "attempt": run.attempt,
        "lease_owner": run.lease_owner,
        "lease_expires": run.lease_expires,
        "waiting_signals": list(run.waiting_signals),
    }


_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(Run))


def changed_values(old: Run, new: Run) -> dict[str, Any]:
    """Only the columns that differ (as ``run_values`` has them): a write never rewrites what
    it did not decide. A field ``dataclasses.replace`` carried over is the same object: no
    comparison of a large input or output."""
    out: dict[str, Any] = {}
    for name in _RUN_FIELDS:
        a, b = getattr(old, name), getattr(new, name)
        if a is b or a == b:
            continue
        if name == "status":
            out[name] = RunStatus(b).value
        elif name in ("tags", "waiting_signals"):
            out[name] = list(b)
        else:
            out[name] = b
    if "tags" in out and (ADMITTED_TAG in old.tags) != (ADMITTED_TAG in new.tags):
        out["admitted"] = ADMITTED_TAG in new.tags
    return out


def event_rows(run_id: str, first_seq: int, evs: Sequence[Event]) -> list[dict[str, Any]]:
    rows = []
    for i, ev in enumerate(evs):
        seq = first_seq + i
        rows.append(
            {
                "run_id": run_id,
                "seq": seq,
                "type": ev.type,
                "at": ev.at,
                "body": event_to_json(ev.model_copy(update={"seq": seq})),
            }
        )
    return rows


def to_event(row: sa.Row[Any]) -> Event:
    m = row._mapping
    body = dict(m["body"])
    body["seq"] = m["seq"]
    return event_from_json(body)


# -- predicates -------------------------------------------------------------------------
def visible(namespace: str | None) -> sa.ColumnElement[bool]:
    return sa.true() if namespace is None else R.namespace == namespace


def leased_sql(now: Any) -> sa.ColumnElement[bool]:
    """``Run.leased(now)``."""
    return sa.and_(R.lease_owner.is_not(None), R.lease_expires.is_not(None), R.lease_expires > now)


def claimable_sql(now: Any) -> sa.ColumnElement[bool]:
    """Mirror of ``memory.claimable``: active, no live lease, and pending/running, or
    cancelling without a wake time, or a wake time that has come."""
    return sa.and_(
        R.status.in_(ACTIVE),
        sa.not_(leased_sql(now)),
        sa.or_(
            R.status.in_(_ALWAYS_CLAIMABLE),
            sa.and_(R.status == _CANCELLING, R.wake_at.is_(None)),
            sa.and_(R.wake_at.is_not(None), R.wake_at <= now),
        ),
    )


def due_time_sql() -> sa.ColumnElement[Any]:
    """Mirror of ``memory.due_time`` (lease expiry, else the status' reference instant)."""
    leased_until = sa.case(
        (
            sa.and_(
                R.status.not_in(_ALWAYS_CLAIMABLE),
                R.wake_at.is_not(None),
                R.wake_at > R.lease_expires,
            ),
            R.wake_at,
        ),
        else_=R.lease_expires,
    )
    return sa.case(
        (sa.and_(R.lease_owner.is_not(None), R.lease_expires.is_not(None)), leased_until),
        (R.status == RunStatus.PENDING.value, R.created_at),
        (
            sa.or_(
                R.status == RunStatus.RUNNING.value,
                sa.and_(R.status == _CANCELLING, R.wake_at.is_(None)),
            ),
            R.updated_at,
        ),
        else_=R.wake_at,
    )


def has_tag_sql(dialect: str, tag: str) -> sa.ColumnElement[bool]:
    """Exact JSON-array membership (``@>`` on PostgreSQL, ``json_each`` on SQLite)."""
    if tag == ADMITTED_TAG:
        return R.admitted.is_(True)
    if dialect == "postgresql":
        return sa.type_coerce(R.tags, JSONB()).contains([tag])
    each = sa.func.json_each(R.tags).table_valued("value")
    return sa.exists().where(each.c.value == tag)


def sharing_sql(dialect: str, workflow: str, tag: str, namespace: str | None) -> sa.Select[Any]:
    """The active runs of ``workflow`` carrying ``tag`` — for a singleton tag, exactly the rows
    of one key through ``ix_flowkit_runs_singleton``; nothing else is read."""
    q = sa.select(runs).where(R.workflow == workflow, R.status.in_(ACTIVE), visible(namespace))
    if tag.startswith(SINGLETON_TAG_PREFIX):
        return q.where(R.singleton_key == tag[len(SINGLETON_TAG_PREFIX) :])
    return q.where(has_tag_sql(dialect, tag))


def lock_name(workflow: str, tag: str) -> str:
    """The advisory-lock name of a singleton key: ``workflow:key``."""
    key = tag[len(SINGLETON_TAG_PREFIX) :] if tag.startswith(SINGLETON_TAG_PREFIX) else tag
    return f"{workflow}:{key}"


__all__ = [
    "ACTIVE",
    "changed_values",
    "claimable_sql",
    "due_time_sql",
    "event_rows",
    "has_tag_sql",
    "leased_sql",
    "lock_name",
    "run_values",
    "sharing_sql",
    "to_event",
    "to_run",
    "visible",
]
