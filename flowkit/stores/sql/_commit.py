"""The commits that decide in Python: the general commit (row lock, ``rules.apply_update``)
and a release's hand-offs, whether planned here (``rules.plan_release``) or in SQL by the lean
releases (PostgreSQL's one statement, SQLite's few). How and why: docs/stores.md."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ... import singleton as _sg
from ..._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from ..._core.search_terms import upserts
from ...errors import ConflictError, RunNotFoundError
from ...events import Event, EventSet, UpdateReplied
from ..base import STAYING_PREFIXES, CommitResult, HandOff, Notify, Update
from ..rules import admitted_event, apply_update, check_commit, claimable, plan_release
from . import _runs as runs
from ._connection import RETURNING, ROWCOUNT, ROWS, SELECT, Conn
from ._group_commit import After, Deferred, GroupCommit, Op
from ._rows import (
    LAST_SEQ,
    NAMESPACE,
    RUN_COLS,
    TAGS,
    VERSION,
    admitted_body,
    dumps,
    loads,
    lock_name,
    run_params,
    to_event,
    to_run,
)
from ._search_sql import write_search
from ._statements import Statements

log = logging.getLogger("flowkit")
T = TypeVar("T")

ARM_LOCK_TIMEOUT_SQL = "SET LOCAL lock_timeout = '5s'"
"""(PostgreSQL) how long ``Commits.arm_skipped`` waits for a head's row that another
transaction holds (a signal's transaction holds it for milliseconds)."""


def wake_if_free(c: Conn, run: Run, now: float) -> None:
    """Emit a wake-up with ``c``'s transaction when it leaves ``run`` claimable now by any
    worker. A run with a lease owner is never woken: a step's commit keeps the lease (even one
    that expired meanwhile: its owner is still at work), so the hot path costs nothing."""
    if run.lease_owner is None and claimable(run, now):
        c.wakeup(run.namespace)


AWAITED = (EventSet, UpdateReplied)
"""Events a reader in another process may wait for (``engine.get_event``, ``engine.update``:
``_history_wait``): a commit that records one emits a wake-up, claimable run or not."""


def _telling(rest: Callable[[Conn, Any], CommitResult]) -> Callable[[Conn, Any], CommitResult]:
    """``rest`` that also emits a wake-up for the committed run's namespace (with the
    transaction's ``COMMIT``, or right after a single statement's)."""

    def told(c: Conn, row: Any) -> CommitResult:
        res = rest(c, row)
        c.wakeup(res.run.namespace)  # (a ``CommitResult``, or an ``AfterRun``)
        return res

    return told


class AfterRun(After[CommitResult]):
    """A commit's result finished once its transaction committed (``After``), whose run is
    known already (a wake-up for its namespace can go with the ``COMMIT``)."""

    __slots__ = ("run",)

    def __init__(self, finish: Callable[[], CommitResult], run: Run) -> None:
        super().__init__(finish)
        self.run = run


def _hit(row: Any) -> bool:
    """``Op.single``: the whole call when its conditional write matched its row."""
    return row is not None


def _released(found: Any) -> bool:
    """``Op.single`` of ``release_fast``: the release was applied (its run's row came back)."""
    return bool(found) and found[0][0] == 0


class Commits:
    """The commit paths of one store (its statements, on its database's write calls)."""

    def __init__(self, sql: Statements, gc: GroupCommit) -> None:
        self.sql = sql
        self.gc = gc

    def op(self, run_id: str, owner: str | None, now: float, update: Update) -> Op[CommitResult]:
        """The write call of ``Store.commit``, by the shortest path that can apply it: one
        conditional ``UPDATE`` (the common commit), a lean release (PostgreSQL's one statement,
        SQLite's few), or the general commit (``locked``), which a missed fast path falls
        back to, as it decides and raises in Python."""
        sql = self.sql
        # a commit that changes the search map takes the general path (its rows follow it)
        general = update.search is not None or upserts(update.events)
        fast = None if general else sql.commit_fast(run_id, owner, now, update)
        whole = None
        n = len(update.events)
        first: tuple[str, Any, int] | None
        if fast is not None:  # the whole change in one conditional UPDATE
            first = (fast[0], fast[1], RETURNING)
            inline = fast[2]

            def rest(c: Conn, row: Any) -> CommitResult:
                if row is not None:
                    last = int(row[LAST_SEQ])
                    if not inline:
                        runs.append(sql, c, run_id, last - n + 1, update.events)
                    new = to_run(row)
                    wake_if_free(c, new, now)
                    return CommitResult(new, tuple(range(last - n + 1, last + 1)))
                # it missed: lock the row and decide (and raise) in Python; in a PostgreSQL
                # batch not here, as that lock would come out of the batch's run-id order
                if c.pipelined:
                    raise Deferred
                return self.locked(c, run_id, owner, now, update)

        elif not general and (whole := sql.release_fast(run_id, owner, now, update)) is not None:
            # (PostgreSQL) a common release in one statement: the slot, handed over
            first = (whole[0], whole[1], ROWS)

            def rest(c: Conn, row: Any) -> CommitResult:  # (all the rows of ``first``)
                if not _released(row):  # a precondition failed: nothing was written
                    if c.pipelined:
                        raise Deferred
                    return self.locked(c, run_id, owner, now, update)
                c.dirty = True  # (it wrote: a failure from here on fails its transaction)
                return self.fast_released(c, row, update, now)

        elif not general and (lean := sql.release_lite(run_id, owner, now, update)) is not None:
            # (SQLite) a common release: the run's row, then its key's oldest waiter
            first = (lean[0], lean[1], RETURNING)
            waiter = lean[2]

            def rest(c: Conn, row: Any) -> CommitResult:
                if row is None:  # a precondition failed: nothing was written
                    return self.locked(c, run_id, owner, now, update)
                return self.lean_released(c, row, update, waiter, now)

        elif update.notify is None:  # the general path, the row lock first (in order)
            first = (sql.get_run_locked, sql.params(id=run_id), SELECT)

            def rest(c: Conn, row: Any) -> CommitResult:
                return self.locked(c, run_id, owner, now, update, row=(row,))

        else:  # a release with notify: the key's lock, then its row with the key's runs
            rn = update.notify
            # (the waiters a release can wake: as many as slots can be free, one if unknown)
            wake = rn.limit if rn.limit is not None else 1
            first = (*sql.locked_with_sharing(run_id, rn.workflow, rn.tag, wake), ROWS)

            def rest(c: Conn, row: Any) -> CommitResult:  # (all the rows of ``first``)
                row, sharing = runs.split(row, rn.tag)
                return self.locked(c, run_id, owner, now, update, row=(row,), sharing=sharing)

        # a release with notify holds the key's advisory lock (taken before any row lock of
        # its transaction, which it may share with other calls). The fast path is complete
        # when its UPDATE matched (PostgreSQL: events inserted by the same statement), so it
        # can run as one statement in autocommit; the one-statement release with its lock
        single: Callable[[Any], bool] | None = None
        if whole is not None:
            single = _released
        elif fast is not None and (fast[2] or not n):
            single = _hit
        rel = update.notify
        locks = () if rel is None else (lock_name(rel.workflow, rel.tag),)
        then: Callable[[Conn, Any], CommitResult] = rest
        if any(isinstance(e, AWAITED) for e in update.events):
            then = _telling(rest)
        return Op(then, first, run_id, single=single, locks=locks)

    def locked(
        self,
        c: Conn,
        run_id: str,
        owner: str | None,
        now: float,
        update: Update,
        row: tuple[Any] | None = None,
        sharing: list[Run] | None = None,
    ) -> CommitResult:
        """The general commit: lock the row (unless ``row`` holds it, already locked),
        decide with ``apply_update``, write the changed columns. Every precondition is checked
        before the first write. A release (``update.notify``) may come with the key's runs,
        read with its row lock (``sharing``)."""
        n = update.notify
        sql = self.sql
        if n is not None:  # advisory lock before any row lock: the admission lock order
            c.lock(lock_name(n.workflow, n.tag))
            if row is None:  # the key's runs come with the row lock (one round trip)
                locked, sharing = runs.locked_with_sharing(sql, c, run_id, n.workflow, n.tag)
                row = (locked,)
        row = c.one(sql.get_run_locked, sql.params(id=run_id)) if row is None else row[0]
        if row is None:
            raise RunNotFoundError(run_id)
        run = to_run(row)
        last_seq = int(row[LAST_SEQ])
        check_commit(run, owner, now, update)
        succ = update.successor
        if succ is not None:  # (continue-as-new: checked before the first write)
            succ = dataclasses.replace(
                succ, run=dataclasses.replace(succ.run, namespace=run.namespace)
            )
            if c.one(sql.get_any_run, {"id": succ.run.id}) is not None:
                raise ConflictError(f"the successor id {succ.run.id!r} of run {run_id!r} is taken")
        if update.consume_signal is not None:
            gone = c.write(sql.consume_signal, {"sid": update.consume_signal, "id": run_id})
            if gone != 1:
                raise ConflictError(f"signal #{update.consume_signal} already consumed")
        names: set[str] = set()
        if update.waiting_signals:
            found = c.all(
                sql.signal_names,
                {"id": run_id, "names": sql.in_list_param(update.waiting_signals)},
            )
            names = {r[0] for r in found}
        new = apply_update(run, update, now, inbox_names=names)
        # the writes go out with the next statement that reads (PostgreSQL: one round trip,
        # and one statement for the row, its events and a hand-off: ``joined``)
        joined: list[tuple[str, dict[str, Any]]] | None = None
        if c.can_pipeline and not c.committed:
            joined = []
        if update.events:
            last = {"last_seq": last_seq + len(update.events)}
            runs.write_changes(sql, c, run, new, later=True, into=joined, **last)
        else:
            runs.write_changes(sql, c, run, new, later=True, into=joined)
        runs.append(sql, c, run_id, last_seq + 1, update.events, later=True, into=joined)
        if new.search != run.search:
            if joined:  # (the run's row first: the search rows follow it)
                c.later(*sql.joined(joined))
                joined.clear()
            write_search(sql, c, run_id, new.search, replace=True)
        wake_if_free(c, new, now)
        seqs = tuple(range(last_seq + 1, last_seq + 1 + len(update.events)))
        # per waiter, in plan order: a hand-off, a woken waiter's id, or a hand-off whose
        # statements go out with others (PostgreSQL), read after the COMMIT
        planned: list[HandOff | str | PendingHandOff] = []
        if n is not None:
            if sharing is None:
                sharing = runs.sharing(sql, c, n.workflow, n.tag)
            else:  # read before this commit's own change: see the run as it now is
                sharing = [
                    r
                    for r in (new if r.id == run_id else r for r in sharing)
                    if r.status.active and n.tag in r.tags
                ]
            for w, admitted in plan_release(sharing, n, now):
                if admitted is not None:
                    if w.id == run_id and joined:  # (its own row: its writes go first)
                        c.later(*sql.joined(joined))
                        joined.clear()
                    got = self.hand_off(c, w, admitted, now, joined if w.id != run_id else None)
                    if got is not None:
                        planned.append(got)
                        continue
                # woken, not handed: it admits itself (a miss above: another process's
                # poller claimed it, or it was cancelled, in the meantime)
                c.later(sql.wake_waiter, {"id": w.id, "now": now})
                c.wakeup(w.namespace)
                planned.append(w.id)
        if joined:  # (no hand-off took them along)
            c.later(*sql.joined(joined))
        arming: list[Any] | None = None
        if n is not None:  # the heads of the queue after it keep a re-check timer
            arming = self.arm(c, n, now, later=True)
        if succ is not None:  # the successor, created with its predecessor's settlement
            succ = dataclasses.replace(succ, run=dataclasses.replace(succ.run, search=new.search))
            c.later(sql.insert_run, run_params(succ.run, len(succ.events)))
            runs.append(sql, c, succ.run.id, 1, succ.events, later=True)
            if succ.run.search:
                write_search(sql, c, succ.run.id, succ.run.search, replace=False)
            # the signals and updates it had not taken go on to the successor, by id (in
            # order); a delivery waiting on the run's row lock then follows the chain
            marks, wakes = STAYING_PREFIXES
            moving: dict[str, Any] = {"id": run_id, "new": succ.run.id, "marks": marks}
            moving |= {"wakes": wakes, "nmarks": len(marks), "nwakes": len(wakes)}
            c.later(sql.move_inbox, moving)
            wake_if_free(c, succ.run, now)
            if succ.run.lease_owner is not None:
                planned.append(HandOff(succ.run, succ.events))

        def result() -> CommitResult:
            done = [p.finish() if isinstance(p, PendingHandOff) else p for p in planned]
            if arming is not None and n is not None and skipped(arming):
                self.arm_skipped(n.workflow, n.tag, n.limit, now + _sg.HEAD_RECHECK)
            woken = tuple(p for p in done if isinstance(p, str))
            return CommitResult(new, seqs, woken, tuple(p for p in done if isinstance(p, HandOff)))

        if arming is not None or any(isinstance(p, PendingHandOff) for p in planned):
            return AfterRun(result, new)  # type: ignore[return-value]  # (GroupCommit finishes it)
        return result()

    def fast_released(
        self, c: Conn, found: Sequence[Any], update: Update, now: float
    ) -> CommitResult:
        """The result of an applied ``PgStatements.release_fast`` from its rows. A waiter it
        handed the slot to comes with its history; one it could not (another transaction
        held its row) is woken after the commit; an unreadable history undoes the hand-off
        after the commit (both as ``PendingHandOff`` does). A new head it could not arm
        (another transaction held its row) is armed after the commit (``arm_skipped``)."""
        k = len(RUN_COLS) + 1
        n = len(update.events)
        new = to_run(found[0][1:k])
        last = int(found[0][LAST_SEQ + 1])
        seqs = tuple(range(last - n + 1, last + 1))
        rn = update.notify
        assert rn is not None
        unarmed = found[-1][0] == 3  # (the head it skipped, last)
        if unarmed:
            found = found[:-1]
        planned = found[-1]
        res: CommitResult | None = None
        pending: PendingHandOff | None = None
        if planned[0] != 2:  # nobody to wake: no waiter, or no free slot
            res = CommitResult(new, seqs)
        else:
            waiter = to_run(planned[1:k])
            if planned[k] == 1:  # not to be handed (leased elsewhere, blocked): woken (stamped)
                c.wakeup(waiter.namespace)
                res = CommitResult(new, seqs, (waiter.id,))
            else:
                pending = PendingHandOff(self, waiter, now)
                handed = [r[1:] for r in found if r[0] == 1]
                pending.updated.append((handed, len(handed)))
        if res is not None and not unarmed:
            return res

        def result() -> CommitResult:
            if unarmed:
                self.arm_skipped(rn.workflow, rn.tag, rn.limit, now + _sg.HEAD_RECHECK)
            if pending is None:
                assert res is not None
                return res
            got = pending.finish()
            if isinstance(got, str):
                return CommitResult(new, seqs, (got,))
            return CommitResult(new, seqs, (), (got,))

        return AfterRun(result, new)  # type: ignore[return-value]  # (GroupCommit finishes it)

    def arm(self, c: Conn, n: Notify, now: float, later: bool = False) -> list[Any] | None:
        """Give the heads of ``n``'s queue, as this transaction leaves it, a re-check timer
        (``singleton.heads_to_arm``; the waiters behind them hold none). On PostgreSQL, what
        the statement returned once it ran (``skipped`` says whether it skipped a head whose
        row another transaction held: the caller then calls ``arm_skipped`` once its
        transaction committed); ``None`` elsewhere."""
        if not n.tag.startswith(SINGLETON_TAG_PREFIX):
            return None
        sql = self.sql
        params = sql.arm_params(n.workflow, n.tag, n.limit, now + _sg.HEAD_RECHECK)
        if sql.SKIPS:
            got: list[Any] = []
            c.later(sql.arm_heads_sql, params, into=got)
            return got
        if later:
            c.later(sql.arm_heads_sql, params)
        else:
            c.write(sql.arm_heads_sql, params)
        return None

    def arm_head(self, c: Conn, run_id: str, at: float) -> list[Any] | None:
        """Give the head waiter ``run_id`` ``wake_at=at`` (``Statements.arm_head``) with the
        transaction's next statement. On PostgreSQL, what it returned once it ran (as
        ``arm``'s: ``skipped``); ``None`` elsewhere."""
        params = {"id": run_id, "at": at}
        if not self.sql.SKIPS:
            c.later(self.sql.arm_head, params)
            return None
        got: list[Any] = []
        c.later(self.sql.arm_head, params, into=got)
        return got

    def then_arm(
        self,
        value: T,
        armed: list[list[Any]],
        workflow: str,
        tag: str,
        limit: int | None,
        at: float,
    ) -> T:
        """``value``, or when the call queued arming statements (``arm_head``'s results in
        ``armed``: PostgreSQL) an ``After`` that arms a head they skipped (``arm_skipped``,
        ``wake_at=at``) once the transaction committed, then gives ``value``."""
        if not armed:
            return value

        def finish() -> T:
            if any(skipped(got) for got in armed):
                self.arm_skipped(workflow, tag, limit, at)
            return value

        return After(finish)  # type: ignore[return-value]  # (GroupCommit finishes it)

    def arm_skipped(self, workflow: str, tag: str, limit: int | None, at: float) -> None:
        """After a transaction that armed the heads of ``tag``'s queue committed, when it
        skipped one whose row another transaction held (PostgreSQL; a signal delivered to it,
        say): arm them in a transaction of its own, which takes the key's advisory lock and
        then *waits* for their rows (``Statements.arm_heads_waiting``). It holds no other row,
        so it closes no lock-order cycle; and a head is never left without its ~1 s re-check
        while the runs ahead of it may settle on an engine that notifies nobody
        (docs/singleton.md, "Deep queues"). A failure is logged (the head then waits for
        the key's next release or start)."""
        sql = self.sql
        params = sql.arm_params(workflow, tag, limit, at)

        def arm(c: Conn, _: Any) -> None:
            if sql.SKIPS:  # (a row held for long: this lane does not wait for it for ever)
                c.later(ARM_LOCK_TIMEOUT_SQL, None, wrote=False)
            c.write(sql.arm_heads_wait, params)

        try:
            self.gc.run_write(Op(arm, None, "", locks=(lock_name(workflow, tag),)))
        except Exception:
            log.warning("arming the heads of %s after a busy row failed", tag, exc_info=True)

    def lean_released(
        self, c: Conn, row: Any, update: Update, waiter: dict[str, Any], now: float
    ) -> CommitResult:
        """``_lean_released``, then the heads of the queue armed (``arm``)."""
        res = self._lean_released(c, row, update, waiter, now)
        assert update.notify is not None
        self.arm(c, update.notify, now)
        return res

    def _lean_released(
        self, c: Conn, row: Any, update: Update, waiter: dict[str, Any], now: float
    ) -> CommitResult:
        """The rest of ``SqliteStatements.release_lite``, once its ``UPDATE`` released the run
        (``row``): its events, then the key's oldest waiter, handed the slot (admitted and
        leased to ``Notify.claim_owner``) when it is free to take, else woken. The same
        decision as ``plan_release`` over the key's rows, read under SQLite's write lock; a
        waiter whose history this code cannot read is woken, not handed."""
        sql = self.sql
        run_id = row[0]
        n = len(update.events)
        last = int(row[LAST_SEQ])
        runs.append(sql, c, run_id, last - n + 1, update.events)
        new = to_run(row)
        seqs = tuple(range(last - n + 1, last + 1))
        found = c.all(sql.release_waiter, waiter)
        k = len(RUN_COLS)
        if not found or not found[0][k + 1]:  # no waiter, or the slot is not free
            return CommitResult(new, seqs)
        w = found[0]
        rn = update.notify
        assert rn is not None
        versions = rn.claim_versions
        if w[k] and (versions is None or w[VERSION] in versions):  # handable: not leased, ...
            try:
                evs = tuple(to_event(r[k + 2], r[k + 3]) for r in found if r[k + 2] is not None)
            except Exception:
                log.warning("not handing over %s: its history cannot be read", w[0], exc_info=True)
            else:
                params = {
                    "id": w[0],
                    "tags": dumps([*loads(w[TAGS]), ADMITTED_TAG]),
                    "admitted": True,
                    "owner": rn.claim_owner,
                    "until": rn.lease_expires,
                    "now": now,
                }
                handed = c.returning(sql.hand_off, params)
                if handed is not None:
                    adm = self.admitted(c, handed, rn.tag, now)
                    hand = HandOff(to_run(handed), (*evs, adm))
                    return CommitResult(new, seqs, (), (hand,))
        c.write(sql.wake_waiter, {"id": w[0], "now": now})
        c.wakeup(w[NAMESPACE])
        return CommitResult(new, seqs, (w[0],))

    def hand_off(
        self,
        c: Conn,
        waiter: Run,
        admitted: Run,
        now: float,
        joined: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> HandOff | PendingHandOff | None:
        """Apply a planned hand-off if the waiter is still free to take (another process's
        poller may have claimed it since it was read), with its history; ``None`` on a miss.
        On PostgreSQL the conditional update and the history read are one statement, queued
        (``PendingHandOff``), with the releasing call's own writes (``joined``) when given. A
        history this code cannot read must not fail the release: the hand-off is undone."""
        sql = self.sql
        tag = next(t for t in admitted.tags if t.startswith(SINGLETON_TAG_PREFIX))
        params = {
            "id": admitted.id,
            "tags": dumps(list(admitted.tags)),
            "admitted": True,
            "owner": admitted.lease_owner,
            "until": admitted.lease_expires,
            "now": now,
            "adm": admitted_body(tag, now),
        }
        if c.can_pipeline and not c.committed:
            pending = PendingHandOff(self, waiter, now)
            if joined:  # the releasing run's writes go with it: one statement for all
                q, params = sql.joined([*joined, (sql.hand_off, params)], handing=True)
                joined.clear()
                c.later(q, params, into=pending.updated)
            else:
                c.later(sql.hand_off_history, params, into=pending.updated)
            return pending
        found, updated = c.reads(
            [(sql.load_events, sql.params(id=admitted.id)), (sql.hand_off, params)],
            wrote=True,
        )
        if not updated:
            return None
        handed = to_run(updated[0])
        try:
            evs = tuple(to_event(seq, body) for seq, body in found if seq is not None)
        except Exception:
            log.warning(
                "not handing over %s: its history cannot be read", admitted.id, exc_info=True
            )
            # as it was, before the hand-off (whose seq it gives back)
            runs.write_changes(sql, c, handed, waiter, last_seq=int(updated[0][LAST_SEQ]) - 1)
            return None
        return HandOff(handed, (*evs, self.admitted(c, updated[0], tag, now)))

    def admitted(self, c: Conn, row: Any, tag: str, now: float) -> Event:
        """Append a handed waiter's ``singleton_admitted`` at the seq its hand-off took."""
        seq = int(row[LAST_SEQ])
        ev = admitted_event(tag, now).model_copy(update={"seq": seq})
        runs.append(self.sql, c, row[0], seq, [ev])
        return ev

    def wake_missed(self, waiter: Run, now: float) -> None:
        """After the releasing transaction committed: wake a waiter whose hand-off missed
        (another process's poller took it meanwhile, or it was cancelled), if it is still
        parked. A hint: if this fails, its re-check timer stays."""

        def woke(c: Conn, n: Any) -> None:
            if n:
                c.wakeup(waiter.namespace)

        first = (self.sql.wake_waiter, {"id": waiter.id, "now": now}, ROWCOUNT)
        try:
            self.gc.run_write(Op(woke, first, waiter.id))
        except Exception:
            log.warning("waking %s after a missed hand-off failed", waiter.id, exc_info=True)

    def undo_hand_off(self, handed: Run, waiter: Run, now: float) -> bool:
        """After the releasing transaction committed: give a handed waiter whose history
        cannot be read back its parked state, woken, in a transaction of its own, if it is
        still as the hand-off left it. Whether it was undone."""
        sql = self.sql

        def undo(c: Conn, row: Any) -> bool:
            if row is None:
                return False
            current = to_run(row)
            if (current.lease_owner, current.status) != (handed.lease_owner, RunStatus.RUNNING):
                return False  # (changed since: a cancel request; leave it to its holder)
            runs.write_changes(sql, c, current, waiter)
            # its singleton_admitted goes with the hand-off (nothing was appended after it)
            seq = int(row[LAST_SEQ])
            if c.write(sql.drop_admitted, {"id": waiter.id, "seq": seq}):
                c.write(sql.unbump, {"id": waiter.id, "seq": seq})
            c.write(sql.wake_waiter, {"id": waiter.id, "now": now})
            c.wakeup(waiter.namespace)
            return True

        first = (sql.get_run_locked, sql.params(id=handed.id), SELECT)
        return self.gc.run_write(Op(undo, first, handed.id))


def skipped(got: list[Any]) -> bool:
    """Whether an arming statement (``Commits.arm``, ``Commits.arm_head``; PostgreSQL) left
    a head without its timer: ``arm_heads`` returns the count it skipped, ``arm_head`` the
    rowcount 0 when its row was held (or changed meanwhile: arming again is harmless)."""
    if not got:
        return False
    rows, count = got[0]
    return bool(rows[0][0]) if rows else count == 0


class PendingHandOff:
    """A hand-off whose statement was queued (PostgreSQL): the conditional update with the
    waiter's history, read once the releasing transaction committed."""

    __slots__ = ("commits", "now", "updated", "waiter")

    def __init__(self, commits: Commits, waiter: Run, now: float) -> None:
        self.commits = commits
        self.waiter = waiter
        self.now = now
        self.updated: list[Any] = []  # [(rows, rowcount)] once run

    def finish(self) -> HandOff | str:
        """The hand-off, or the waiter's id when it was only woken."""
        commits, waiter = self.commits, self.waiter
        rows = self.updated[0][0]
        if not rows:  # a miss: wake it, if it is still parked
            commits.wake_missed(waiter, self.now)
            return waiter.id
        handed = to_run(rows[0])
        try:
            k = len(RUN_COLS)  # (each row: the run's columns, then an event's seq and body)
            evs = tuple(to_event(r[k], r[k + 1]) for r in rows if r[k] is not None)
        except Exception:
            log.warning("not handing over %s: its history cannot be read", waiter.id, exc_info=True)
            if commits.undo_hand_off(handed, waiter, self.now):
                return waiter.id
            raise
        return HandOff(handed, evs)


__all__ = ["AfterRun", "Commits", "PendingHandOff", "skipped", "wake_if_free"]
