"""Reads and writes of run rows on the store's connection, shared by ``SqlStore``'s calls and
the commit paths (``_commit``): a key's runs, a run's changed columns, its new events."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._core.run import Run
from ...events import Event
from ._connection import Conn
from ._rows import changed_values, column_params, event_params, to_event, to_run
from ._statements import Statements

Parts = list[tuple[str, dict[str, Any]]]


def sharing(sql: Statements, c: Conn, workflow: str, tag: str) -> list[Run]:
    """The active runs of ``workflow`` carrying ``tag``."""
    q, params = sql.sharing(workflow, tag)
    return [r for r in map(to_run, c.all(q, params)) if tag in r.tags]


def locked_with_sharing(
    sql: Statements, c: Conn, run_id: str, workflow: str, tag: str
) -> tuple[Any, list[Run]]:
    """The run's row, locked, and the active runs sharing ``tag``: one statement."""
    q, params = sql.locked_with_sharing(run_id, workflow, tag)
    return split(c.all(q, params), tag)


def split(found: Sequence[Any], tag: str) -> tuple[Any, list[Run]]:
    """The rows of ``Statements.locked_with_sharing``: the run's row (or ``None``) and the
    runs sharing ``tag``."""
    row: Any = None
    runs: list[Run] = []
    for r in found:
        if r[0] == 0:
            row = tuple(r[1:])
        else:
            other = to_run(r[1:])
            if tag in other.tags:
                runs.append(other)
    if row is not None and all(r.id != row[0] for r in runs):
        me = to_run(row)  # (a waiter behind the ones read: it decides about itself)
        if me.status.active and tag in me.tags:
            runs.append(me)
    return row, runs


def write_changes(
    sql: Statements,
    c: Conn,
    old: Run,
    new: Run,
    *,
    later: bool = False,
    into: Parts | None = None,
    **extra: Any,
) -> None:
    """Write the columns that changed from ``old`` to ``new`` (and ``extra``): at once,
    queued (``later``), or as a part of a joined statement (``into``, ``PgStatements.joined``)."""
    changes = changed_values(old, new) | extra
    if changes:
        cols = sorted(changes)
        params = column_params(changes)
        params["id"] = old.id
        if into is not None:
            into.append((sql.update(cols), params))
        else:
            (c.later if later else c.write)(sql.update(cols), params)


def append(
    sql: Statements,
    c: Conn,
    run_id: str,
    first_seq: int,
    evs: Sequence[Event],
    *,
    later: bool = False,
    into: Parts | None = None,
) -> None:
    """Insert ``evs`` at ``first_seq`` (past ``last_seq`` of the locked run row); the primary
    key ``(run_id, seq)`` still refuses a second writer of the same position. ``later`` and
    ``into`` as for ``write_changes``."""
    if evs:
        params: dict[str, Any] = {"id": run_id}
        event_params(params, first_seq, evs)
        if into is not None:
            into.append((sql.insert_events(len(evs)), params))
        else:
            (c.later if later else c.write)(sql.insert_events(len(evs)), params)


def history(sql: Statements, c: Conn, run_id: str) -> list[Event] | None:
    """The run's events, or ``None`` for an unknown run."""
    found = c.all(sql.load_events, sql.params(id=run_id))
    if not found:
        return None
    return [to_event(seq, body) for seq, body in found if seq is not None]


__all__ = ["append", "history", "locked_with_sharing", "sharing", "split", "write_changes"]
