"""``SqlStore.claim_gated`` (``base.ClaimsGated``, mixed into the store): a gated waiter's
re-check decided in its claim, one transaction that reads no history.

1. The plain claim, one statement as ``claim``'s, except that it leaves gated waiters alone
   (``_gated.gated_waiter`` in SQL): every other due run is claimed as before, at no cost.
2. When it claimed nothing: the run's row (one read by id) says whether it is a gated
   waiter of a pair the worker runs, and of which key.
3. Then the admission's transaction, as ``try_admit_singleton``'s: the key's advisory lock
   (PostgreSQL; SQLite's write lock holds everything already), the row locked with the key's
   holders and ``limit + 1`` oldest waiters in one statement, the decision
   (``_gated.decide``), and its writes with the ``COMMIT``: admitted, the claim, the marker
   and ``singleton_admitted``; denied, the next ``wake_at`` only; the key's heads without a
   timer armed in both cases."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ... import singleton as _sg
from ..._run import Run
from ...errors import RunNotFoundError
from .._gated import decide, gated_limit, gated_waiter, parked
from ..base import GateCheck, WorkflowVersions
from ..rules import of_versions
from . import _runs as runs
from ._connection import RETURNING, ROWS, Conn
from ._group_commit import GroupCommit, Op
from ._rows import LAST_SEQ, lock_name, to_run
from ._statements import Statements


def _always(_result: Any) -> bool:
    return True


def ungated(sql: Statements, claim: str) -> str:
    """The claim statement ``claim`` (``Statements.claim`` or ``claim_of``) leaving out the
    gated waiters (``_gated.gated_waiter``: the claim rule holds already)."""
    gated = (
        f"status = 'suspended' AND singleton_key IS NOT NULL AND admitted = {sql.FALSE}"
        f" AND (deadline_at IS NULL OR deadline_at > {sql.p('now')})"
    )
    return claim.replace(" RETURNING ", f" AND NOT ({gated}) RETURNING ", 1)


class GatedClaims:
    """Mixed into ``SqlStore`` (which sets ``_gc`` and ``_sql`` and has ``claim`` and
    ``get_run``)."""

    _gc: GroupCommit
    _sql: Statements
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
        """``claim(gate=)``: ``q`` (the claim statement) and its ``params`` leaving the gated
        waiters out (step 1), then a gated waiter's decision (steps 2 and 3)."""
        run_id, owner, now, until = params["id"], params["owner"], params["now"], params["until"]
        cache = self.__dict__.setdefault("_ungated", {})
        stmt = cache.get(q)
        if stmt is None:
            stmt = cache[q] = ungated(self._sql, q)

        def claimed(c: Conn, row: Any) -> Run | None:
            return None if row is None else to_run(row)

        first = (stmt, params, RETURNING)
        got = await self._gc.write(Op(claimed, first, run_id, single=_always))
        if got is not None:
            return got
        run = await self.get_run(run_id)
        if run is None or not of_versions(run, versions) or not gated_waiter(run, now):
            return None  # (not claimable: changed since, the poller sees it again)
        limit = gated_limit(run, now, gate)
        if limit is None:  # (a gated waiter of a pair not decided here: claimed as before)
            return await self.claim(run_id, owner, now, until, versions=versions)
        return await self._decide(run, limit, owner, now, until, gate, versions)

    async def _decide(
        self,
        seen: Run,
        limit: int,
        owner: str,
        now: float,
        lease_expires: float,
        gate: GateCheck,
        versions: WorkflowVersions | None,
    ) -> Run | None:
        """The admission's transaction for the gated waiter ``seen`` (step 3)."""
        sql = self._sql
        wf, tag, run_id = seen.workflow, seen.singleton_tag or "", seen.id

        def op(c: Conn, found: Any) -> Run | None:
            row, sharing = runs.split(found, tag)
            if row is None:
                raise RunNotFoundError(run_id)
            run = to_run(row)
            if not of_versions(run, versions) or gated_limit(run, now, gate) != limit:
                return None  # (it changed since it was read: the poller sees it again)
            d = decide(run, sharing, limit, gate, owner, now, lease_expires)
            if d.events:  # its singleton_admitted, with the marker and the lease
                seq = int(row[LAST_SEQ]) + 1
                runs.write_changes(sql, c, run, d.run, later=True, last_seq=seq)
                runs.append(sql, c, run_id, seq, d.events, later=True)
            else:
                runs.write_changes(sql, c, run, d.run, later=True)
            after = [d.run if r.id == run_id else r for r in sharing]
            for wid in _sg.heads_to_arm(after, tag, wf, limit, d.arm_at):
                if wid != run_id:
                    c.later(sql.arm_head, {"id": wid, "at": d.arm_at})
            return d.run if d.admitted else parked(d.run)

        # (limit + 1 waiters: the heads once this run is admitted, as try_admit_singleton's)
        first = (*sql.locked_with_sharing(run_id, wf, tag, limit + 1), ROWS)
        return await self._gc.write(Op(op, first, run_id, locks=(lock_name(wf, tag),)))


__all__ = ["GatedClaims", "ungated"]
