"""The worker's poll reads in SQL (``due_runs`` and the ``next_due*`` instants), built so that
an index serves every part: they never read every active run, so an idle worker's poll
costs the same with a million parked runs as with none."""

from __future__ import annotations

from typing import Any

MOVING = "'cancelling', 'pending', 'running'"  # due by creation/update unless leased
PARKED_OR_CANCELLING = "'blocked', 'cancelling', 'suspended'"  # due by wake time


def due_runs(
    st: Any, cols: str, names: str, due_where: str, extra: str, table: str, tail: str
) -> str:
    """The due runs of ``st`` (a ``Statements``): the runs that move (pending, running,
    cancelling: in flight or a backlog) by ``status`` and the parked ones by wake time
    through ``ix_flowkit_runs_due`` up to ``now``, whatever else filters them (the index of
    a workflow or a version would walk every parked run of it); the union is ordered by
    ``tail`` (its rows are claimable, so few beyond the batch)."""
    moving = f"status IN ({MOVING}) AND (status <> 'cancelling' OR wake_at IS NULL)"
    parked = f"status IN ({PARKED_OR_CANCELLING}) AND wake_at <= {st.p('now')}"
    one = f"SELECT {names} FROM {table} WHERE {due_where}{extra} AND {moving}"
    two = f"SELECT {names} FROM flowkit_runs{st.DUE_INDEX} WHERE {due_where}{extra}"
    return f"SELECT {cols} FROM ({one} UNION ALL {two} AND {parked}) AS due{tail}"


def next_due(st: Any, due: str, active: str, cmp: str, skip: str) -> str:
    """The first ``due`` instant (the SQL of ``rules.due_time``) that is ``cmp`` (``" > :now"``
    or ``" IS NOT NULL"``), as the minimum of index-served parts (``rules.due_time`` term by
    term), never a scan of every active run: the leased runs (``ix_flowkit_runs_leased``:
    those in flight), the unleased parked runs by wake time (``ix_flowkit_runs_due``, one
    ``LIMIT 1`` per status), and the unleased pending/running/cancelling runs by status (in
    flight or a backlog: their instant is their creation or their last update)."""
    ns = st.ns
    free = "(lease_owner IS NULL OR lease_expires IS NULL)"
    parts = [
        f"SELECT MIN({due}) FROM flowkit_runs{st.LEASED_INDEX} WHERE lease_owner IS NOT NULL"
        f" AND lease_expires IS NOT NULL AND status IN ({active}){ns}{skip}"
        f" AND ({due}){cmp}",
        f"SELECT MIN({due}) FROM flowkit_runs WHERE status IN ({MOVING}) AND {free}"
        f"{ns}{skip} AND ({due}){cmp}",
    ] + [
        f"SELECT wake_at FROM flowkit_runs WHERE status = '{s}' AND wake_at{cmp}"
        f" AND {free}{ns}{skip} ORDER BY wake_at LIMIT 1"
        for s in ("blocked", "cancelling", "suspended")
    ]
    union = " UNION ALL ".join(f"SELECT ({q}) AS d" for q in parts)
    return f"SELECT MIN(d) FROM ({union}) AS due"


__all__ = ["MOVING", "PARKED_OR_CANCELLING", "due_runs", "next_due"]
