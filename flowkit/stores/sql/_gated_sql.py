"""``SqlStore.claim(gate=)`` (``base.ClaimsGated``, mixed into the store): a gated waiter's
re-check decided in its claim, one transaction that reads no history.

* SQLite (its write lock serializes every key already): one transaction reads the run's row;
  a gated waiter of a pair the worker runs is decided there (the key's holders and
  ``limit + 1`` oldest waiters read, ``_gated.decide``, its writes), any other run claimed
  by the plain claim statement.
* PostgreSQL (a key is serialized by its advisory lock, taken first in a transaction): one
  statement claims any run but a gated waiter, or else returns the gated waiter's row
  (writing nothing); then the admission's transaction, as ``try_admit_singleton``'s: the
  key's lock, the row locked with the key's runs in one statement, the decision, and its
  writes with the ``COMMIT``.

Admitted: the claim, the marker and ``singleton_admitted``; denied: the next ``wake_at`` only.
The key's heads without a timer are armed in both cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import singleton as _sg
from ..._core.run import Run
from ...errors import RunNotFoundError
from .._gated import decide, gated_limit, parked
from ..base import GateCheck, WorkflowVersions
from ..rules import of_versions
from . import _runs as runs
from ._commit import Commits
from ._connection import ROWS, Conn
from ._group_commit import GroupCommit, Op
from ._rows import LAST_SEQ, lock_name, to_run
from ._statements import Statements, claimable


def _always(_result: Any) -> bool:
    return True


def gated_sql(sql: Statements) -> str:
    """``_gated.gated_waiter`` in SQL, but for the claim rule (the claim checks it)."""
    return (
        f"status = 'suspended' AND singleton_key IS NOT NULL AND admitted = {sql.FALSE}"
        f" AND lease_owner IS NULL AND (deadline_at IS NULL OR deadline_at > {sql.p('now')})"
    )


def claim_or_gated(sql: Statements, claim: str) -> str:
    """(PostgreSQL) one statement: the claim statement ``claim`` (``Statements.claim`` or
    ``claim_of``) leaving the gated waiters out, its row as ``0``; else the row of the run
    when it is a claimable gated waiter (of the same versions), as ``1``, nothing written."""
    gated = gated_sql(sql)
    upd = claim.replace(" RETURNING ", f" AND NOT ({gated}) RETURNING ", 1)
    rule = claimable(sql.p("now"))
    if claim == sql.claim_of:
        rule += f" AND {sql.in_versions('vers')}"
    return (
        f"WITH u AS ({upd}) SELECT 0 AS k, u.* FROM u UNION ALL"
        f" SELECT 1 AS k, r.* FROM ({sql.get_run} AND {gated} AND {rule}) AS r"
        f" WHERE NOT EXISTS (SELECT 1 FROM u)"
    )


class GatedClaims:
    """Mixed into ``SqlStore`` (which sets ``_gc`` and ``_sql`` and has ``claim`` and
    ``get_run``)."""

    _gc: GroupCommit
    _sql: Statements
    _commits: Commits
    _ungated: dict[str, str]

    claims_gated = True
    """``claim`` takes ``gate`` (``base.ClaimsGated``)."""

    if TYPE_CHECKING:  # (``SqlStore``'s and ``Reads``')

        async def claim(
            self,
            run_id: str,
            owner: str,
            now: float,
            lease_expires: float,
            *,
            versions: WorkflowVersions | None = None,
        ) -> Run | None: ...

        async def get_run(self, run_id: str) -> Run | None: ...

    async def _claim_gated(
        self,
        q: str,
        params: dict[str, Any],
        gate: GateCheck,
        versions: WorkflowVersions | None,
    ) -> Run | None:
        """``claim(gate=)``: ``q`` (the claim statement) with its ``params``, but for a gated
        waiter of a pair in ``gate.limits``, decided instead."""
        sql = self._sql
        run_id, owner, now, until = params["id"], params["owner"], params["now"], params["until"]
        if not sql.CTE_WRITES:  # SQLite: everything in one transaction

            def lite(c: Conn, _: None) -> Run | None:
                row = c.one(sql.get_run, sql.params(id=run_id))
                seen = None if row is None else to_run(row)
                limit = None
                if seen is not None and of_versions(seen, versions):
                    limit = gated_limit(seen, now, gate)
                if seen is None or limit is None:
                    claimed = c.returning(q, params)
                    return None if claimed is None else to_run(claimed)
                tag = seen.singleton_tag or ""
                key = sql.locked_with_sharing(run_id, seen.workflow, tag, limit + 1)
                return self._decided(c, c.all(*key), seen, limit, owner, now, until, gate, versions)

            return await self._gc.write(Op(lite, None, run_id))
        cache = self.__dict__.setdefault("_ungated", {})
        stmt = cache.get(q)
        if stmt is None:
            stmt = cache[q] = claim_or_gated(sql, q)

        def first_rows(c: Conn, rows: Any) -> tuple[int, Run] | None:
            return None if not rows else (int(rows[0][0]), to_run(tuple(rows[0][1:])))

        got = await self._gc.write(Op(first_rows, (stmt, params, ROWS), run_id, single=_always))
        if got is None:
            return None
        kind, run = got
        if kind == 0:
            return run
        limit = gated_limit(run, now, gate)
        if limit is None:  # (a gated waiter of a pair not decided here: claimed as before)
            return await self.claim(run_id, owner, now, until, versions=versions)
        return await self._decide(run, limit, owner, now, until, gate, versions)

    def _decided(
        self,
        c: Conn,
        found: Any,
        seen: Run,
        limit: int,
        owner: str,
        now: float,
        until: float,
        gate: GateCheck,
        versions: WorkflowVersions | None,
    ) -> Run | None:
        """Decide ``seen``'s re-check over ``found`` (``Statements.locked_with_sharing``'s
        rows, read under the key's serialization) and queue its writes."""
        sql = self._sql
        wf, tag, run_id = seen.workflow, seen.singleton_tag or "", seen.id
        row, sharing = runs.split(found, tag)
        if row is None:
            raise RunNotFoundError(run_id)
        run = to_run(row)
        if not of_versions(run, versions) or gated_limit(run, now, gate) != limit:
            return None  # (it changed since it was read: the poller sees it again)
        d = decide(run, sharing, limit, gate, owner, now, until)
        if d.events:  # its singleton_admitted, with the marker and the lease
            seq = int(row[LAST_SEQ]) + 1
            runs.write_changes(sql, c, run, d.run, later=True, last_seq=seq)
            runs.append(sql, c, run_id, seq, d.events, later=True)
        else:
            runs.write_changes(sql, c, run, d.run, later=True)
        after = [d.run if r.id == run_id else r for r in sharing]
        armed: list[list[Any]] = []  # (PostgreSQL: what each arming returned)
        for wid in _sg.heads_to_arm(after, tag, wf, limit, d.arm_at):
            if wid != run_id:
                got = self._commits.arm_head(c, wid, d.arm_at)
                if got is not None:
                    armed.append(got)
        out = d.run if d.admitted else parked(d.run)
        return self._commits.then_arm(out, armed, wf, tag, limit, d.arm_at)

    async def _decide(
        self,
        seen: Run,
        limit: int,
        owner: str,
        now: float,
        until: float,
        gate: GateCheck,
        versions: WorkflowVersions | None,
    ) -> Run | None:
        """(PostgreSQL) the admission's transaction for the gated waiter ``seen``."""
        wf, tag, run_id = seen.workflow, seen.singleton_tag or "", seen.id

        def op(c: Conn, found: Any) -> Run | None:
            return self._decided(c, found, seen, limit, owner, now, until, gate, versions)

        # (limit + 1 waiters: the heads once this run is admitted, as try_admit_singleton's)
        first = (*self._sql.locked_with_sharing(run_id, wf, tag, limit + 1), ROWS)
        return await self._gc.write(Op(op, first, run_id, locks=(lock_name(wf, tag),)))


__all__ = ["GatedClaims", "claim_or_gated", "gated_sql"]
