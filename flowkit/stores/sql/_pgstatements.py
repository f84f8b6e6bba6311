"""PostgreSQL's statements (``PgStatements``): its spelling of the shared SQL, ``SKIP LOCKED``
hand-offs, and a release or a creation in one statement. Apart from the connection
(``_postgres.PgConn``) because they are pure SQL text, built once per store.

Why and how: docs/stores.md, "PostgreSQL: many workers on many hosts"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX
from ...singleton import HEAD_RECHECK
from ..base import Update
from ._rows import JSON_COLS, RUN_COLS, admitted_body, dumps
from ._schema import BY_ID, WAITING_SQL
from ._statements import ACTIVE, HANDABLE, Statements, common_release, leased

_ADMITTED_JSON = "'" + dumps([ADMITTED_TAG]) + "'"  # (a SQL literal)


class PgStatements(Statements):
    """PostgreSQL's spelling: ``%(name)s`` parameters, ``jsonb`` (read back as text), row locks
    that skip a waiter another transaction holds, and the statements that do in one round trip
    what SQLite does in several."""

    COLS = ", ".join(f"{c}::text" if c in JSON_COLS else c for c in RUN_COLS)
    BY_ID = BY_ID["postgresql"]
    TEXT = "::text"
    FOR_UPDATE = " FOR UPDATE"
    TRUE, FALSE = "true", "false"
    EMPTY_LIST = "'[]'::jsonb"
    CTE_WRITES = True
    SKIPS = True

    def __init__(self, namespace: str | None) -> None:
        super().__init__(namespace)
        p, j = self.p, self.j
        self.deliver_and_insert = (
            f"WITH u AS ({self.deliver}), s AS (INSERT INTO flowkit_signals (run_id, name, payload)"
            f" SELECT u.id, {p('name')}, {j('payload')} FROM u) SELECT * FROM u"
        )
        # the hand-off, its ``singleton_admitted`` and the waiter's history in one statement
        # (the run's columns, then each event's seq and body; no rows on a miss)
        self.hand_off_history = self.handing(f"h AS ({self.hand_off})")
        self._joined: dict[tuple[tuple[str, ...], bool], str] = {}

    def p(self, name: str) -> str:
        return f"%({name})s"

    def j(self, name: str) -> str:
        return f"%({name})s::jsonb"

    def in_list(self, column: str, name: str) -> str:
        return f"{column} = ANY({self.p(name)})"

    def in_list_param(self, values: Sequence[str]) -> Any:
        return list(values)

    def in_versions(self, name: str) -> str:
        # (two parallel arrays.) The ``= ANY`` terms are what the planner estimates well and
        # looks up in ix_flowkit_runs_version; the pairs' test then drops the cross products
        # (a worker with w1 v1 and w2 v2 must not take w1 v2)
        wf, v = self.p(name + "_wf"), self.p(name + "_v")
        return (
            f"workflow = ANY({wf}::text[]) AND workflow_version = ANY({v}::text[])"
            f" AND (workflow, workflow_version) IN"
            f" (SELECT * FROM unnest({wf}::text[], {v}::text[]))"
        )

    def versions_params(
        self, params: dict[str, Any], name: str, pairs: Sequence[tuple[str, str]]
    ) -> None:
        params[name + "_wf"] = [w for w, _ in pairs]
        params[name + "_v"] = [v for _, v in pairs]

    def waits_for(self, name: str) -> str:
        return f"waiting_signals ? {self.p(name)}"

    def carries_tag(self) -> str:
        return f"tags @> {self.p('tags')}::jsonb"

    def tag_params(self, params: dict[str, Any], tag: str) -> None:
        params["tags"] = dumps([tag])

    def unless_locked(self, cond: str) -> str:
        # another process's group commit may hold the waiter's row and wait for the
        # releaser's (a lock-order cycle): a locked waiter is skipped (it admits itself later)
        return f"id = (SELECT id FROM flowkit_runs WHERE {cond} FOR UPDATE SKIP LOCKED)"

    def arm_heads(self) -> str:
        """``Statements.arm_heads``, returning the number of heads it skipped (another
        transaction held their rows): one row, the count."""
        p, at = self.p, self.p("at")
        due = f"status = 'suspended' AND (wake_at IS NULL OR wake_at > {at})"
        cond = f"id IN (SELECT h.id FROM ({self.waiters()} LIMIT {p('n')}) AS h) AND {due}"
        return (
            f"WITH c AS (SELECT id FROM flowkit_runs WHERE {cond}),"
            f" a AS (UPDATE flowkit_runs SET wake_at = {at} WHERE id IN"
            f" ({self._heads(f'id IN (SELECT id FROM c) AND {due}')}) RETURNING id)"
            f" SELECT count(*) FROM c WHERE id NOT IN (SELECT id FROM a)"
        )

    def drop_marker(self) -> list[str]:
        return [f"tags = tags - '{ADMITTED_TAG}'", "admitted = false"]

    # -- statements that carry their events ---------------------------------------------------
    def _values(self, n: int, *, seq: bool = True) -> str:
        p, j = self.p, self.j
        return ", ".join(
            f"({p(f's{i}') if seq else i}, {p(f't{i}')}, {p(f'a{i}')}::float8, {j(f'b{i}')})"
            for i in range(n)
        )

    def create_with_events(self, n: int) -> str:
        """The run's ``INSERT ... ON CONFLICT DO NOTHING`` and its ``n`` events in one
        statement; its row count is ``n`` when the run was created, 0 when the id existed."""
        key = ("create", n)
        sql = self._cache.get(key)
        if sql is None:
            sql = (
                f"WITH r AS ({self.insert_run_new} RETURNING id)"
                f" INSERT INTO flowkit_events (run_id, seq, type, at, body)"
                f" SELECT r.id, v.seq, v.type, v.at, v.body FROM r,"
                f" (VALUES {self._values(n)}) AS v(seq, type, at, body)"
            )
            if n <= 16:
                self._cache[key] = sql
        return sql

    def with_events(self, update: str, n: int) -> str:
        """A commit's ``UPDATE ... RETURNING`` and the insert of its ``n`` events at the seqs
        it assigned (``last_seq`` of the updated row); the rows are the update's (none when a
        precondition failed: then nothing was inserted)."""
        return f"WITH u AS ({update}), e AS ({self._events_of('u', n)}) SELECT * FROM u"

    def _events_of(self, cte: str, n: int) -> str:
        """The insert of ``n`` events (``event_params``, no seqs) of the run the query
        ``cte`` returned, at the seqs up to its new ``last_seq``."""
        seq = f"{cte}.last_seq - {n} + v.k + 1"
        return (
            f"INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT {cte}.id, {seq}, v.type, v.at, jsonb_set(v.body, '{{seq}}', to_jsonb({seq}))"
            f" FROM {cte}, (VALUES {self._values(n, seq=False)}) AS v(k, type, at, body)"
        )

    def append_sql(self, n: int) -> tuple[str, bool, bool]:
        """The row's ``UPDATE`` and the insert of the events in one statement, returning
        ``(id, last_seq)``: the whole call."""
        return self.with_events(self.append_update(n, "GREATEST"), n), True, True

    # -- hand-offs ----------------------------------------------------------------------------
    def handing(self, ctes: str) -> str:
        """``ctes`` (which define ``h``, a hand-off's ``RETURNING``) followed by the insert of
        the handed waiter's ``singleton_admitted`` (body ``adm``, at the seq the hand-off
        took) and the select of the waiter's columns with its whole history."""
        ev = (
            f" ev AS (INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT h.id, h.last_seq, 'singleton_admitted', h.updated_at,"
            f" jsonb_set({self.p('adm')}::jsonb, '{{seq}}', to_jsonb(h.last_seq)) FROM h"
            f" RETURNING run_id, seq, body)"
        )
        return (
            f"WITH {ctes},{ev} SELECT h.*, e.seq, e.body::text FROM h"
            f" LEFT JOIN flowkit_events e ON e.run_id = h.id"
            f" UNION ALL SELECT h.*, ev.seq, ev.body::text FROM h"
            f" JOIN ev ON ev.run_id = h.id ORDER BY seq"
        )

    def joined(
        self, parts: Sequence[tuple[str, dict[str, Any]]], *, handing: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """Several writes of one call, each on rows none of the others writes, as one
        statement (its ``WITH`` queries; the parameters of part ``i`` renamed ``p<i>_``). All
        parts see one snapshot and all run to completion. With ``handing`` the last part is
        ``hand_off`` and the statement returns what ``hand_off_history`` does."""
        if len(parts) == 1 and not handing:
            return parts[0]
        key = (tuple(q for q, _ in parts), handing)
        sql = self._joined.get(key)
        if sql is None:
            *head, tail = [_renamed(q, f"p{i}_") for i, (q, _) in enumerate(parts)]
            ctes = ", ".join(f"w{i} AS ({q})" for i, q in enumerate(head))
            if handing:
                sql = self.handing(f"{ctes}, h AS ({tail})" if ctes else f"h AS ({tail})")
            else:
                sql = f"WITH {ctes} {tail}"
            if len(self._joined) < 64:
                self._joined[key] = sql
        params = {f"p{i}_{k}": v for i, (_, ps) in enumerate(parts) for k, v in ps.items()}
        if handing:
            params["adm"] = parts[-1][1]["adm"]
        return sql, params

    # -- a release in one statement -----------------------------------------------------------
    def commit_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], bool] | None:
        """``Statements.commit_fast``, except a suspension that waits for signals: that one
        takes the general path, which locks the row first and then reads the inbox in a
        statement of its own. In one ``UPDATE`` the inbox check would read the snapshot the
        statement started with: a signal delivered by a transaction that held the row until
        just before (``deliver_signal`` locks the row of a running run too) would be missed,
        and the run would sleep through it (READ COMMITTED re-reads only the updated row)."""
        if u.waiting_signals and u.status is not None and u.status.active:
            return None
        return super().commit_fast(run_id, owner, now, u)

    def release_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any]] | None:
        """A common release (``common_release``) as one statement deciding as
        ``rules.plan_release`` does, or ``None``. Its rows (``k``, the run's columns, an
        event's ``seq`` and ``body``): ``k = 0`` the released run (none: nothing was written);
        ``k = 1`` the handed waiter, a row per event of its history; ``k = 2`` the waiter
        planned for, as it was (``seq`` 1: only woken); ``k = 3`` (last) the key's new head
        when it was left without its timer. A waiter another transaction holds (``SKIP
        LOCKED``) is neither handed, woken nor armed here: the caller does it after the
        commit (``Commits.fast_released``)."""
        n = u.notify
        if n is None or owner is None or not common_release(u, n):
            return None
        shape, params, _inline = self.commit_shape(run_id, owner, now, u)
        params["wf"] = n.workflow
        params["key"] = n.tag[len(SINGLETON_TAG_PREFIX) :]
        params["tagj"] = dumps([n.tag])
        params["cowner"] = n.claim_owner
        # (None: any version; a NULL array makes the version test true)
        params["cvers"] = None if n.claim_versions is None else sorted(n.claim_versions)
        params["until"] = n.lease_expires
        params["adm"] = admitted_body(n.tag, now)
        params["arm"] = now + HEAD_RECHECK
        key = ("release", *shape)
        sql = self._commits.get(key)
        if sql is None:
            sql = self._release_sql(shape)
            self._commits[key] = sql
        return sql, params

    def _release_sql(self, shape: tuple[Any, ...]) -> str:
        p, ns = self.p, self.ns
        now = p("now")
        # ``(status || '')``: a status test that is no index condition, so the planner finds a
        # waiter's row by its id, never by a scan of every run with that status. The key's
        # holders: a range of ix_flowkit_runs_queue or ix_flowkit_runs_singleton; its oldest
        # waiter: the first entry of ix_flowkit_runs_waiting (its predicate word for word).
        status = "(status || '')"
        key_rows = (
            f"FROM flowkit_runs WHERE workflow = {p('wf')} AND singleton_key = {p('key')}{ns}"
            f" AND tags @> {p('tagj')}::jsonb AND id <> {p('id')}"
        )

        # (the waiter's row, locked unless another transaction holds it)
        def waiter(cond: str, check: str) -> str:
            return (
                f"id = (SELECT id FROM flowkit_runs WHERE id = (SELECT w.id FROM w, free"
                f" WHERE free.ok AND {cond}) AND {check} FOR UPDATE SKIP LOCKED)"
                f" AND EXISTS (SELECT 1 FROM me)"
            )

        # rules.hand_off_ok, and a version the releasing worker has (Notify.claim_versions)
        handable = (
            f"{status} IN ({HANDABLE}) AND NOT {leased(now)} AND ({p('cvers')}::text[] IS NULL"
            f" OR workflow_version = ANY({p('cvers')}::text[]))"
        )
        hand = waiter("w.handable", f"{handable} AND NOT admitted")
        wake = waiter("NOT w.handable", f"{status} = 'suspended'")
        waiter_cols = ", ".join(f"w.{c}" for c in RUN_COLS)
        # the new head (``hd``) parked without a timer due by then, unless woken here
        unarmed = (
            f"id = (SELECT id FROM hd) AND id NOT IN (SELECT w.id FROM w, free WHERE free.ok)"
            f" AND {status} = 'suspended' AND (wake_at IS NULL OR wake_at > {p('arm')})"
        )
        return (
            f"WITH me AS ({self.commit_sql(shape, releasing=True)}),"
            f" e AS ({self._events_of('me', shape[-1])}),"
            f" free AS (SELECT NOT EXISTS (SELECT 1 {key_rows}"
            f" AND admitted = true AND status IN ({ACTIVE})) AS ok),"
            # the oldest waiter (singleton.waiters: active, not admitted, not cancelling)
            f" w AS (SELECT {self.COLS}, {handable} AS handable {key_rows}"
            f" AND admitted = false AND {WAITING_SQL} ORDER BY created_at, {self.BY_ID} LIMIT 1),"
            f" h AS (UPDATE flowkit_runs SET tags = tags || {_ADMITTED_JSON}::jsonb,"
            f" admitted = true, status = 'running', wake_at = NULL,"
            f" lease_owner = {p('cowner')}, lease_expires = {p('until')}, updated_at = {now},"
            f" last_seq = last_seq + 1 WHERE {hand} RETURNING {self.COLS}),"
            # (the handed waiter's singleton_admitted, in this transaction)
            f" ev AS (INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT h.id, h.last_seq, 'singleton_admitted', h.updated_at,"
            f" jsonb_set({p('adm')}::jsonb, '{{seq}}', to_jsonb(h.last_seq)) FROM h"
            f" RETURNING run_id, seq, body),"
            f" wk AS (UPDATE flowkit_runs SET wake_at = {now}"
            f" WHERE {wake} RETURNING id),"
            # the head of the queue it leaves keeps a re-check timer (singleton.heads_to_arm,
            # limit 1, exactly as the general path decides): the waiter after the one handed
            # the slot, else the oldest one, unless it is the waiter ``wk`` just woke (or
            # would: a woken waiter is due now). All parts see one snapshot, so the handed
            # waiter is still among the two oldest (``w2``): skip it by counting ``h``.
            f" w2 AS (SELECT id, created_at {key_rows} AND admitted = false AND {WAITING_SQL}"
            f" ORDER BY created_at, {self.BY_ID} LIMIT 2),"
            f" hd AS (SELECT id FROM w2 ORDER BY created_at, {self.BY_ID}"
            f" OFFSET (SELECT count(*) FROM h) LIMIT 1),"
            f" ar AS (UPDATE flowkit_runs SET wake_at = {p('arm')} WHERE id = (SELECT id FROM"
            f" flowkit_runs WHERE {unarmed} FOR UPDATE SKIP LOCKED)"
            f" AND EXISTS (SELECT 1 FROM me) RETURNING id),"
            # (that head, when its row was held by another transaction: armed after the
            # commit, waiting for its row, ``Commits.arm_skipped``)
            f" sk AS (SELECT id FROM flowkit_runs WHERE {unarmed}"
            f" AND EXISTS (SELECT 1 FROM me) AND NOT EXISTS (SELECT 1 FROM ar))"
            f" SELECT 0 AS k, me.*, NULL::integer AS seq, NULL::text AS body FROM me"
            f" UNION ALL SELECT 1, h.*, e2.seq, e2.body::text FROM h"
            f" LEFT JOIN flowkit_events e2 ON e2.run_id = h.id"
            f" UNION ALL SELECT 1, h.*, ev.seq, ev.body::text FROM h JOIN ev ON ev.run_id = h.id"
            f" UNION ALL SELECT 2, {waiter_cols}, CASE WHEN w.handable THEN 0 ELSE 1 END, NULL"
            f" FROM w, free WHERE free.ok"
            f" UNION ALL SELECT 3, {self.COLS}, NULL, NULL FROM flowkit_runs"
            f" WHERE id = (SELECT id FROM sk)"
            f" ORDER BY k, seq"
        )


_PARAM = re.compile(r"%\((\w+)\)s")  # a named parameter of a statement


def _renamed(sql: str, prefix: str) -> str:
    """``sql`` with its named parameters prefixed (``PgStatements.joined``)."""
    return _PARAM.sub(lambda m: f"%({prefix}{m.group(1)})s", sql)


__all__ = ["PgStatements"]
