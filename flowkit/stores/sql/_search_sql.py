"""``SqlStore``'s search attributes and retention (docs/search-and-retention.md): the rows of
``flowkit_search`` written with a run's create or commit, the ``list_runs`` query (filters pushed
into SQL on that table's indexes, keyset paging, no payload columns), and ``prune_runs``
(``Pruning``, mixed into the store)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from ..._core.run import TERMINAL_STATUSES, Run, RunStatus
from ..._core.search_terms import SearchValue, Term, kind_of
from ._connection import Conn
from ._database import Database
from ._group_commit import GroupCommit
from ._rows import has_tag, run_from_mapping, visible
from ._schema import BY_ID, PER_RUN_TABLES, event_buffer, published_events, runs
from ._schema import search as search_table
from ._statements import Statements

_PAYLOADS = frozenset({"input", "output", "error"})
LIST_COLUMNS = tuple(c for c in runs.c if c.name not in _PAYLOADS)
"""What a listing selects: every column of the run but its payloads (``get_run`` has them)."""

_TERMINAL = sorted(s.value for s in TERMINAL_STATUSES)


def _row(run_id: str, name: str, value: SearchValue) -> dict[str, Any]:
    kind = kind_of(value)
    return {
        "run_id": run_id,
        "name": name,
        "text": value if kind == "text" else None,
        "num": float(value) if kind == "num" else None,
        "flag": bool(value) if kind == "flag" else None,
    }


def write_search(
    sql: Statements,
    c: Conn,
    run_id: str,
    attrs: Mapping[str, SearchValue],
    *,
    replace: bool,
) -> None:
    """Queue (``Conn.later``) the statements that make ``run_id``'s rows of
    ``flowkit_search`` hold ``attrs``: one multi-row ``INSERT`` (after a ``DELETE`` of the
    old rows when ``replace``), in the caller's transaction."""
    p = sql.p
    if replace:
        c.later(f"DELETE FROM flowkit_search WHERE run_id = {p('sid')}", {"sid": run_id})
    if not attrs:
        return
    params: dict[str, Any] = {"sid": run_id}
    values = []
    for i, (name, value) in enumerate(sorted(attrs.items())):
        row = _row(run_id, name, value)
        params[f"sn{i}"] = name
        params[f"st{i}"] = row["text"]
        params[f"su{i}"] = row["num"]
        params[f"sf{i}"] = row["flag"]
        values.append(f"({p('sid')}, {p(f'sn{i}')}, {p(f'st{i}')}, {p(f'su{i}')}, {p(f'sf{i}')})")
    c.later(
        "INSERT INTO flowkit_search (run_id, name, text, num, flag) VALUES " + ", ".join(values),
        params,
    )


def _column(value: SearchValue) -> tuple[sa.ColumnElement[Any], Any]:
    kind = kind_of(value)
    s = search_table.c
    if kind == "text":
        return s.text, value
    if kind == "num":
        return s.num, float(value)
    return s.flag, bool(value)


def term_clause(t: Term) -> sa.ColumnElement[bool]:
    """The runs passing ``t`` (``_search_terms.matches``): ``id IN`` the run ids that one
    index range of ``flowkit_search`` yields (``name`` first, then the value's column)."""
    s = search_table.c
    conds: list[sa.ColumnElement[bool]] = [s.name == t.name]
    if t.op in ("==", "in"):
        by_col: dict[str, tuple[sa.ColumnElement[Any], list[Any]]] = {}
        for v in t.values:
            col, bound = _column(v)
            by_col.setdefault(str(col.key), (col, []))[1].append(bound)
        alts = [c == vs[0] if len(vs) == 1 else c.in_(vs) for c, vs in by_col.values()]
        if not alts:
            return sa.false()
        conds.append(alts[0] if len(alts) == 1 else sa.or_(*alts))
    elif t.op == "!=":
        col, bound = _column(t.values[0])
        conds.append(sa.or_(col.is_(None), col != bound))
    else:
        col, bound = _column(t.values[0])
        ops = {"<": col < bound, "<=": col <= bound, ">": col > bound, ">=": col >= bound}
        conds.append(ops[t.op])
    return runs.c.id.in_(sa.select(s.run_id).where(*conds))


class Pruning:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_db``, ``_gc`` and ``_sql``):
    ``list_runs`` and ``prune_runs``."""

    namespace: str | None
    _db: Database
    _gc: GroupCommit
    _sql: Statements

    def list_query(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
        parent_id: str | None = None,
        search: Sequence[Term] = (),
        after: tuple[float, str] | None = None,
    ) -> sa.Select[Any]:
        """The ``list_runs`` statement (public for the plan tests: ``EXPLAIN`` it)."""
        r = runs.c
        q = sa.select(*LIST_COLUMNS).where(visible(self.namespace))
        if workflow is not None:
            q = q.where(r.workflow == workflow)
        if status is not None:
            q = q.where(r.status == RunStatus(status).value)
        if tag is not None:
            q = q.where(has_tag(self._db.dialect, tag))
        if parent_id is not None:  # (ix_flowkit_runs_parent)
            q = q.where(r.parent_id == parent_id)
        for t in search:
            q = q.where(term_clause(t))
        if after is not None:  # keyset paging on ix_flowkit_runs_created (no OFFSET)
            at, rid = after
            # (``created_at >= at`` first: a range seek on the index, on both databases)
            q = q.where(r.created_at >= at, sa.or_(r.created_at > at, r.id > rid))
        q = q.order_by(r.created_at, sa.literal_column(BY_ID[self._db.dialect]))
        if limit is not None:
            q = q.limit(limit)
        return q

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
        parent_id: str | None = None,
        search: Sequence[Term] = (),
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        q = self.list_query(
            workflow=workflow,
            status=status,
            tag=tag,
            limit=limit,
            parent_id=parent_id,
            search=search,
            after=after,
        )
        db = self._db

        def read() -> list[Run]:
            with db.tx(write=False) as conn:
                return [run_from_mapping(row) for row in conn.execute(q)]

        out = await self._gc.call(read)
        return out if tag is None else [run for run in out if tag in run.tags]

    async def prune_runs(
        self,
        settled_before: float,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        limit: int = 500,
    ) -> int:
        r = runs.c
        parent = runs.alias("parent")
        pick = (
            sa.select(r.id, r.parent_id)
            .where(
                visible(self.namespace),
                r.status.in_(_TERMINAL),
                r.updated_at < settled_before,
                sa.or_(
                    r.parent_id.is_(None),
                    ~sa.exists().where(
                        parent.c.id == r.parent_id, parent.c.status.not_in(_TERMINAL)
                    ),
                ),
            )
            .order_by(r.updated_at)
            .limit(limit)
        )
        if workflow is not None:
            pick = pick.where(r.workflow == workflow)
        if status is not None:
            pick = pick.where(r.status == RunStatus(status).value)
        db = self._db
        if db.dialect == "postgresql":  # (rows a commit holds are left for the next batch)
            pick = pick.with_for_update(skip_locked=True, of=runs)

        aged = workflow is None and status is None
        namespace = self.namespace or ""

        def write() -> int:
            with db.tx() as conn:
                if aged:
                    # published events of no run, by age (at most ``limit`` of each a batch):
                    # the buffer and the event-id dedupe
                    for table, key in ((event_buffer, "id"), (published_events, "event_id")):
                        old = (
                            sa.select(table.c[key])
                            .where(table.c.namespace == namespace, table.c.at < settled_before)
                            .limit(limit)
                        )
                        conn.execute(
                            sa.delete(table).where(
                                table.c.namespace == namespace, table.c[key].in_(old)
                            )
                        )
                picked = list(conn.execute(pick))
                ids = [row[0] for row in picked]
                if not ids:
                    return 0
                parents = {row[1] for row in picked if row[1] is not None}
                if parents and db.dialect == "postgresql":
                    # The pick's test of the parents ran on its snapshot, not under a lock
                    # (READ COMMITTED): an ``engine.retry`` of a parent committed since would
                    # leave an active parent without its child. Lock the parents (a retry
                    # waits for this transaction) and test them again, on what is committed.
                    locked = conn.execute(
                        sa.select(r.id, r.status)
                        .where(r.id.in_(parents))
                        .with_for_update(read=True)
                    )  # (every parent, whatever its status: a terminal one is what a retry opens)
                    active = {row[0] for row in locked if row[1] not in _TERMINAL}
                    ids = [row[0] for row in picked if row[1] not in active]
                    if not ids:
                        return 0
                for table in PER_RUN_TABLES:
                    conn.execute(sa.delete(table).where(table.c.run_id.in_(ids)))
                conn.execute(sa.delete(runs).where(r.id.in_(ids)))
                return len(ids)

        return await self._gc.call(write, read=False)


__all__ = ["LIST_COLUMNS", "Pruning", "term_clause", "write_search"]
