"""Rows <-> ``Run``/``Event``: the columns every run query returns and the conversions.

The hot paths bind JSON as text (orjson) and read it back as text; ``list_runs`` goes through
SQLAlchemy (``run_from_mapping``), whose JSON columns come back decoded."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

from ..._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from ...events import Event, SingletonAdmitted, event_from_json, event_to_json
from ._schema import runs

RUN_COLS = (
    "id",
    "workflow",
    "workflow_version",
    "status",
    "input",
    "output",
    "error",
    "tags",
    "created_at",
    "updated_at",
    "wake_at",
    "namespace",
    "singleton_key",
    "attempt",
    "lease_owner",
    "lease_expires",
    "waiting_signals",
    "deadline_at",
    "recoveries",
    "parent_id",
    "continued_as",
    "search",
    "last_seq",
)
"""The columns every run query returns, in ``Run`` field order (``last_seq`` last)."""
LAST_SEQ = RUN_COLS.index("last_seq")
TAGS = RUN_COLS.index("tags")
NAMESPACE = RUN_COLS.index("namespace")
VERSION = RUN_COLS.index("workflow_version")
JSON_COLS = frozenset({"input", "output", "error", "tags", "waiting_signals", "search"})
_STATUS = {s.value: s for s in RunStatus}
_RUN_FIELDS = tuple(f.name for f in dataclasses.fields(Run))


def dumps(value: Any) -> str:
    """A value as JSON text (a ``None`` is the JSON ``null``, as SQLAlchemy's JSON type has it)."""
    return orjson.dumps(value).decode()


def loads(value: Any) -> Any:
    """JSON text (or SQL ``NULL``) as a value."""
    return None if value is None else orjson.loads(value)


def to_run(row: Sequence[Any]) -> Run:
    """A run from the columns of ``RUN_COLS`` (JSON as text)."""
    return Run(
        row[0],
        row[1],
        row[2],
        _STATUS[row[3]],
        loads(row[4]),
        loads(row[5]),
        loads(row[6]),
        tuple(loads(row[7]) or ()),
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
        row[13],
        row[14],
        row[15],
        tuple(loads(row[16]) or ()),
        row[17],
        row[18],
        row[19],
        row[20],
        loads(row[21]) or {},
    )


def to_event(seq: int, body: Any) -> Event:
    """An event from its ``seq`` and JSON body (text); ``HistoryError`` for a corrupt one."""
    data = loads(body)
    if not isinstance(data, dict):
        data = {"corrupt": data}  # event_from_json reports it as a HistoryError
    data["seq"] = seq
    return event_from_json(data)


def run_params(run: Run, last_seq: int) -> dict[str, Any]:
    """The insert parameters of ``run``; ``admitted`` follows the tags."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": RunStatus(run.status).value,
        "input": dumps(run.input),
        "output": dumps(run.output),
        "error": dumps(run.error),
        "tags": dumps(list(run.tags)),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "wake_at": run.wake_at,
        "namespace": run.namespace,
        "singleton_key": run.singleton_key,
        "attempt": run.attempt,
        "lease_owner": run.lease_owner,
        "lease_expires": run.lease_expires,
        "waiting_signals": dumps(list(run.waiting_signals)),
        "deadline_at": run.deadline_at,
        "recoveries": run.recoveries,
        "parent_id": run.parent_id,
        "continued_as": run.continued_as,
        "search": dumps(run.search),
        "last_seq": last_seq,
        "admitted": ADMITTED_TAG in run.tags,
    }


def event_params(params: dict[str, Any], first_seq: int, evs: Sequence[Event]) -> None:
    """The values of ``evs`` at ``first_seq``... as parameters ``s<i>``, ``t<i>``, ``a<i>``,
    ``b<i>`` (seq, type, at, body) of ``params``."""
    for i, ev in enumerate(evs):
        seq = first_seq + i
        body = event_to_json(ev)
        body["seq"] = seq
        params[f"s{i}"] = seq
        params[f"t{i}"] = ev.type
        params[f"a{i}"] = ev.at
        params[f"b{i}"] = dumps(body)


def column_params(values: dict[str, Any]) -> dict[str, Any]:
    """Column values as parameters (JSON columns as text)."""
    return {k: dumps(v) if k in JSON_COLS else v for k, v in values.items()}


def admitted_body(tag: str, now: float) -> str:
    """The JSON body of the ``singleton_admitted`` a hand-off appends (seq set by SQL)."""
    ev = SingletonAdmitted(key=tag[len(SINGLETON_TAG_PREFIX) :], at=now)
    return dumps(event_to_json(ev))


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


def lock_name(workflow: str, tag: str) -> str:
    """The advisory-lock name of a singleton key: ``workflow:key``."""
    key = tag[len(SINGLETON_TAG_PREFIX) :] if tag.startswith(SINGLETON_TAG_PREFIX) else tag
    return f"{workflow}:{key}"


# -- through SQLAlchemy (list_runs, tools) ------------------------------------------------


def run_values(run: Run) -> dict[str, Any]:
    """The row of ``run`` for SQLAlchemy; ``admitted`` follows the tags."""
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
        "search": dict(run.search),
    }


def run_from_mapping(row: sa.Row[Any]) -> Run:
    """A run from a SQLAlchemy row of ``runs`` (JSON decoded); a row without the payload
    columns (``list_runs``) gives ``None`` for them."""
    m = row._mapping  # noqa: SLF001  (Row._mapping is SQLAlchemy's documented public API)
    return Run(
        id=m["id"],
        workflow=m["workflow"],
        workflow_version=m["workflow_version"],
        status=RunStatus(m["status"]),
        input=m.get("input"),
        output=m.get("output"),
        error=m.get("error"),
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
        deadline_at=m["deadline_at"],
        recoveries=m["recoveries"],
        parent_id=m["parent_id"],
        continued_as=m["continued_as"],
        search=m["search"] or {},
    )


def visible(namespace: str | None) -> sa.ColumnElement[bool]:
    """The runs a store scoped to ``namespace`` sees."""
    return sa.true() if namespace is None else runs.c.namespace == namespace


def has_tag(dialect: str, tag: str) -> sa.ColumnElement[bool]:
    """Exact JSON-array membership (``@>`` on PostgreSQL, ``json_each`` on SQLite)."""
    if tag == ADMITTED_TAG:
        return runs.c.admitted.is_(True)
    if dialect == "postgresql":
        return sa.type_coerce(runs.c.tags, JSONB()).contains([tag])
    each = sa.func.json_each(runs.c.tags).table_valued("value")
    return sa.exists().where(each.c.value == tag)


__all__ = [
    "JSON_COLS",
    "LAST_SEQ",
    "NAMESPACE",
    "RUN_COLS",
    "TAGS",
    "admitted_body",
    "changed_values",
    "column_params",
    "dumps",
    "event_params",
    "has_tag",
    "loads",
    "lock_name",
    "run_from_mapping",
    "run_params",
    "run_values",
    "to_event",
    "to_run",
    "visible",
]
