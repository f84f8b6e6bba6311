"""The hot-path SQL of ``SqlStore``, built once per store and cached by shape.

``Statements`` holds what both dialects share, with the SQL mirror of the claim rule next to
the claim; ``_sqlite.SqliteStatements`` and ``_postgres.PgStatements`` fill in the dialect's
spelling (placeholders, JSON, locks) and the statements only one of them has."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._core.run import ACTIVE_STATUSES, ADMITTED_TAG, SINGLETON_TAG_PREFIX, RunStatus
from ..base import UNSET, Notify, Update
from . import _due_sql as _due
from ._rows import JSON_COLS, RUN_COLS, dumps, event_params
from ._schema import WAITING_SQL

NAMES = ", ".join(RUN_COLS)
ACTIVE = ", ".join(f"'{s}'" for s in sorted(s.value for s in ACTIVE_STATUSES))
HANDABLE = "'pending', 'running', 'suspended'"  # rules.hand_off_ok


# -- the claim rule in SQL: mirrors of ``flowkit.stores.rules`` -----------------------------
# (``tests/test_sql_end_to_end.py`` compares them with the Python rules on random run states)
def leased(now: str) -> str:
    """``Run.leased(now)``."""
    return f"(lease_owner IS NOT NULL AND lease_expires IS NOT NULL AND lease_expires > {now})"


def claimable(now: str) -> str:
    """``rules.claimable``."""
    return (
        f"status IN ({ACTIVE}) AND NOT {leased(now)} AND (status IN ('pending', 'running')"
        f" OR (status = 'cancelling' AND wake_at IS NULL)"
        f" OR (wake_at IS NOT NULL AND wake_at <= {now}))"
    )


LOST = "CASE WHEN lease_owner IS NOT NULL AND status IN ('running', 'cancelling') THEN 1 ELSE 0 END"
"""``rules.lost_activation`` (1 or 0): a claim or a ``release_leases`` takes over the lease
of an activation that died (``Run.recoveries``)."""

DUE = (
    "CASE WHEN lease_owner IS NOT NULL AND lease_expires IS NOT NULL THEN"
    " CASE WHEN status NOT IN ('pending', 'running') AND wake_at IS NOT NULL"
    " AND wake_at > lease_expires THEN wake_at ELSE lease_expires END"
    " WHEN status = 'pending' THEN created_at"
    " WHEN status = 'running' OR (status = 'cancelling' AND wake_at IS NULL) THEN updated_at"
    " ELSE wake_at END"
)
"""``rules.due_time``."""


def common_release(u: Update, n: Notify) -> bool:
    """A release the one-statement (PostgreSQL) and the lean (SQLite) paths take: a terminal
    commit with its events (at most 16) and no signal to consume, notifying a ``limit=1``
    singleton key whose freed slot may be handed over (``Notify.claim_owner``)."""
    return (
        n.limit == 1
        and not u.revives
        and n.claim_owner is not None
        and (n.max_hand_offs is None or n.max_hand_offs >= 1)
        and u.consume_signal is None
        and u.status is not None
        and not u.status.active
        and 0 < len(u.events) <= 16
        and n.tag.startswith(SINGLETON_TAG_PREFIX)
    )


class Statements:
    """The statements of one store (one namespace) on one dialect; subclasses spell them."""

    COLS = NAMES  # the run columns a query returns (PostgreSQL: JSON as text)
    BY_ID = "id"  # FIFO ties and every other order of run ids: code points, as in Python
    TEXT = ""  # a JSON column read as text
    FOR_UPDATE = ""  # a row lock
    SKIPS = False  # arming a head skips a row another transaction holds (``unless_locked``)
    TRUE, FALSE = "1", "0"
    EMPTY_LIST = "'[]'"
    WAITING_INDEX = ""  # the index a key's first waiters are read through
    VERSION_INDEX = ""  # the index the due runs of some versions are read through
    LEASED_INDEX = ""  # the index the leased runs are read through (``_next_due``)
    DUE_INDEX = ""  # the index the parked due runs are read through (``due_runs``)
    # one statement writes what depends on its write too (a data-modifying WITH): a commit or
    # a creation with its events, a signal with its delivery
    CTE_WRITES = False
    hand_off_history: str  # (PostgreSQL) ``hand_off`` returning the waiter's history
    deliver_and_insert: str  # (PostgreSQL) ``deliver`` and ``insert_signal`` in one
    release_waiter: str  # (SQLite) a key's oldest waiter with its history

    def __init__(self, namespace: str | None) -> None:
        self.namespace = namespace
        cols = self.COLS
        ns = f" AND namespace = {self.p('ns')}" if namespace is not None else ""
        self.ns = ns
        p, j = self.p, self.j
        self.get_run = f"SELECT {cols} FROM flowkit_runs WHERE id = {p('id')}{ns}"
        self.get_run_locked = self.get_run + self.FOR_UPDATE
        self.get_any_run = f"SELECT {cols} FROM flowkit_runs WHERE id = {p('id')}"
        # one statement: no rows for an unknown run, one row of NULLs for a run without events
        self.load_events = (
            f"SELECT e.seq, e.body{self.TEXT} FROM flowkit_runs r"
            f" LEFT JOIN flowkit_events e ON e.run_id = r.id"
            f" WHERE r.id = {p('id')}{ns.replace('namespace', 'r.namespace')} ORDER BY e.seq"
        )
        self.insert_run = (
            f"INSERT INTO flowkit_runs ({NAMES}, admitted) VALUES ("
            + ", ".join(j(c) if c in JSON_COLS else p(c) for c in RUN_COLS)
            + f", {p('admitted')})"
        )
        self.insert_run_new = self.insert_run + " ON CONFLICT (id) DO NOTHING"
        self.claim = (
            f"UPDATE flowkit_runs SET"
            f" status = CASE WHEN status = 'cancelling' THEN status ELSE 'running' END,"
            f" recoveries = recoveries + {LOST},"
            f" wake_at = NULL, lease_owner = {p('owner')}, lease_expires = {p('until')},"
            f" updated_at = {p('now')}"
            f" WHERE id = {p('id')}{ns} AND {claimable(p('now'))} RETURNING {cols}"
        )
        # (a worker with some versions only: ``base.ClaimsByVersion``)
        self.claim_of = self.claim.replace(
            " RETURNING ", f" AND {self.in_versions('vers')} RETURNING ", 1
        )
        self.renew = (
            # (never shortened: a late renewal landing after a newer one must not take back
            # what the newer one granted; the worker's lease proof relies on it)
            f"UPDATE flowkit_runs SET lease_expires = CASE WHEN lease_expires > {p('until')}"
            f" THEN lease_expires ELSE {p('until')} END"
            f" WHERE id = {p('id')}{ns} AND lease_owner = {p('owner')} AND status IN ({ACTIVE})"
            f" RETURNING {cols}"
        )
        self.release_owned = (
            f"UPDATE flowkit_runs SET lease_owner = NULL, lease_expires = NULL,"
            f" updated_at = {p('now')}, recoveries = recoveries + {LOST}"
            f" WHERE lease_owner = {p('owner')}{ns} AND status IN ({ACTIVE}) RETURNING id"
        )
        wakes = f"status = 'suspended' AND {self.waits_for('name')}"
        self.deliver = (
            f"UPDATE flowkit_runs SET"
            f" wake_at = CASE WHEN {wakes} THEN {p('now')} ELSE wake_at END,"
            f" updated_at = CASE WHEN {wakes} THEN {p('now')} ELSE updated_at END"
            f" WHERE id = {p('id')}{ns} AND continued_as IS NULL RETURNING {cols}"
        )
        # (continue-as-new: what the run had not taken goes on to its successor, by id; the
        # prefixes compared exactly, as ``base.moves_to_successor`` does: SQLite's LIKE
        # ignores case)
        self.move_inbox = (
            f"UPDATE flowkit_signals SET run_id = {p('new')}"
            f" WHERE run_id = {p('id')} AND substr(name, 1, {p('nmarks')}) <> {p('marks')}"
            f" AND substr(name, 1, {p('nwakes')}) <> {p('wakes')}"
        )
        self.insert_signal = (
            f"INSERT INTO flowkit_signals (run_id, name, payload)"
            f" VALUES ({p('id')}, {p('name')}, {j('payload')})"
        )
        self.peek_signal = (
            f"SELECT id, name, payload{self.TEXT} FROM flowkit_signals"
            f" WHERE run_id = {p('id')} AND name = {p('name')} ORDER BY id LIMIT 1"
        )
        # the encryption marker (``flowkit.stores.codec._mark``): read, and recorded once
        self.get_meta = f"SELECT value FROM flowkit_meta WHERE key = {p('key')}"
        self.put_meta = (
            f"INSERT INTO flowkit_meta (key, value) VALUES ({p('key')}, {p('value')})"
            " ON CONFLICT (key) DO NOTHING"
        )
        self.consume_signal = (
            f"DELETE FROM flowkit_signals WHERE id = {p('sid')} AND run_id = {p('id')}"
        )
        self.signal_names = (
            f"SELECT DISTINCT name FROM flowkit_signals"
            f" WHERE run_id = {p('id')} AND {self.in_list('name', 'names')}"
        )
        # what is due, read through indexes only (``_due_sql``: never every active run)
        due_where = f"NOT {leased(p('now'))}{ns}"
        due_tail = f" ORDER BY {DUE}, created_at, {self.BY_ID} LIMIT {p('limit')}"

        def due(extra: str = "", table: str = "flowkit_runs") -> str:
            return _due.due_runs(self, cols, NAMES, due_where, extra, table, due_tail)

        self.due_runs = due()
        self.due_runs_of = due(f" AND {self.in_list('workflow', 'wfs')}")
        # (by ``ix_flowkit_runs_version``: a fleet of old and new workers reads only its own)
        self.due_runs_vers = due(
            f" AND {self.in_versions('vers')}", f"flowkit_runs{self.VERSION_INDEX}"
        )
        skip = f" AND (lease_owner IS NULL OR NOT {self.in_list('lease_owner', 'skip')})"
        self.next_due = _due.next_due(self, DUE, ACTIVE, " IS NOT NULL", "")
        self.next_due_skip = _due.next_due(self, DUE, ACTIVE, " IS NOT NULL", skip)
        # next_due_after: only instants later than `now` (what is due already is not a deadline)
        later = f" > {p('now')}"
        self.next_due_after = _due.next_due(self, DUE, ACTIVE, later, "")
        self.next_due_after_skip = _due.next_due(self, DUE, ACTIVE, later, skip)
        sharing = f"SELECT {cols} FROM flowkit_runs WHERE workflow = {p('wf')}"
        sharing += f" AND status IN ({ACTIVE}){ns}"
        self.sharing_key = f"{sharing} AND singleton_key = {p('key')}"
        self.count_key = (
            f"SELECT count(*) FROM flowkit_runs WHERE workflow = {p('wf')}"
            f" AND status IN ({ACTIVE}){ns} AND singleton_key = {p('key')}"
        )
        self.sharing_admitted = f"{sharing} AND admitted"
        self.sharing_tag = f"{sharing} AND {self.carries_tag()}"
        # (the hand-off takes the seq of the waiter's ``singleton_admitted``, which the same
        # transaction appends: ``rules.admitted_event``)
        hand_if = (
            f"id = {p('id')} AND status IN ({HANDABLE}) AND NOT admitted AND NOT {leased(p('now'))}"
        )
        self.hand_off = (
            f"UPDATE flowkit_runs SET tags = {j('tags')}, admitted = {p('admitted')},"
            f" status = 'running', wake_at = NULL, lease_owner = {p('owner')},"
            f" lease_expires = {p('until')}, updated_at = {p('now')}, last_seq = last_seq + 1"
            f" WHERE {self.unless_locked(hand_if)} RETURNING {cols}"
        )
        wake_if = f"id = {p('id')} AND status = 'suspended'"
        self.wake_waiter = (
            f"UPDATE flowkit_runs SET wake_at = {p('now')} WHERE {self.unless_locked(wake_if)}"
        )
        # a hand-off undone (the waiter's history cannot be read): its admission record goes
        self.drop_admitted = (
            f"DELETE FROM flowkit_events WHERE run_id = {p('id')} AND seq = {p('seq')}"
            f" AND type = 'singleton_admitted'"
        )
        self.unbump = f"UPDATE flowkit_runs SET last_seq = {p('seq')} - 1 WHERE id = {p('id')}"
        self.arm_heads_sql = self.arm_heads()
        self.arm_heads_wait = self.arm_heads_waiting()
        arm_if = (
            f"id = {p('id')} AND status = 'suspended' AND NOT admitted"
            f" AND (wake_at IS NULL OR wake_at > {p('at')})"
        )
        self.arm_head = (
            f"UPDATE flowkit_runs SET wake_at = {p('at')} WHERE {self.unless_locked(arm_if)}"
        )
        self._updates: dict[tuple[str, ...], str] = {}
        self._commits: dict[tuple[Any, ...], str] = {}
        self._cache: dict[tuple[str, int], str] = {}
        self._cache_text: dict[str, str] = {}
        self._appends: dict[int, tuple[str, bool, bool]] = {}

    def params(self, **kw: Any) -> dict[str, Any]:
        """Statement parameters, with the store's namespace (``ns``) when it has one."""
        if self.namespace is not None:
            kw["ns"] = self.namespace
        return kw

    # -- the dialect's spelling ---------------------------------------------------------------
    def p(self, name: str) -> str:
        """A parameter."""
        raise NotImplementedError

    def j(self, name: str) -> str:
        """A JSON parameter (bound as text)."""
        raise NotImplementedError

    def in_list(self, column: str, name: str) -> str:
        """``column`` is one of the strings of the list parameter ``name`` (``in_list_param``
        gives its value)."""
        raise NotImplementedError

    def in_list_param(self, values: Sequence[str]) -> Any:
        raise NotImplementedError

    def in_versions(self, name: str) -> str:
        """The run's ``(workflow, workflow_version)`` is one of the pairs of the parameter
        ``name`` (``versions_params`` sets it)."""
        raise NotImplementedError

    def versions_params(
        self, params: dict[str, Any], name: str, pairs: Sequence[tuple[str, str]]
    ) -> None:
        raise NotImplementedError

    def waits_for(self, name: str) -> str:
        """The run's ``waiting_signals`` hold the parameter ``name``."""
        raise NotImplementedError

    def carries_tag(self) -> str:
        """The run's tags hold the tag of ``tag_params``."""
        raise NotImplementedError

    def tag_params(self, params: dict[str, Any], tag: str) -> None:
        raise NotImplementedError

    def unless_locked(self, cond: str) -> str:
        """``cond`` on a waiter's row, which a release locks after its own: PostgreSQL skips
        a row another transaction holds (no lock-order cycle); SQLite has one writer."""
        return cond

    def drop_marker(self) -> list[str]:
        """The ``SET`` terms that drop a run's admission marker (a terminal commit)."""
        raise NotImplementedError

    def key_holders(self, q: str) -> str:
        """``q`` (the key's active runs) narrowed to its holders' index range."""
        return q

    def append_sql(self, n: int) -> tuple[str, bool, bool]:
        """``append``'s statement for ``n`` events (built once per ``n``)."""
        raise NotImplementedError

    def with_events(self, update: str, n: int) -> str:
        """A commit's ``UPDATE`` that also inserts its ``n`` events (``CTE_WRITES``)."""
        raise NotImplementedError

    def create_with_events(self, n: int) -> str:
        """(PostgreSQL) ``insert_run_new`` and the run's ``n`` events in one statement."""
        raise NotImplementedError

    def joined(
        self, parts: Sequence[tuple[str, dict[str, Any]]], *, handing: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """(PostgreSQL) several writes of one call as one statement."""
        raise NotImplementedError

    # -- the common statements ----------------------------------------------------------------
    def insert_events(self, n: int) -> str:
        """One multi-row ``INSERT`` of ``n`` events of run ``id`` (``event_params``)."""
        key = ("insert", n)
        sql = self._cache.get(key)
        if sql is None:
            values = ", ".join(
                f"({self.p('id')}, {self.p(f's{i}')}, {self.p(f't{i}')}, {self.p(f'a{i}')},"
                f" {self.j(f'b{i}')})"
                for i in range(n)
            )
            sql = f"INSERT INTO flowkit_events (run_id, seq, type, at, body) VALUES {values}"
            if n <= 16:
                self._cache[key] = sql
        return sql

    def append(self, n: int) -> tuple[str, bool, bool]:
        """``append_events`` of ``n`` events (``event_params``, no seqs): the statement,
        whether it is the whole call, and whether it takes ``now`` and ``n``. A run not leased
        by ``owner``, or not ``running``, matches nothing."""
        got = self._appends.get(n)
        if got is None:
            got = self.append_sql(n)
            if n <= 16:
                self._appends[n] = got
        return got

    def append_update(self, n: int, greatest: str) -> str:
        """The run row's part of a step's record: ``UPDATE ... RETURNING id, last_seq``."""
        p = self.p
        where = f"id = {p('id')}{self.ns} AND lease_owner = {p('owner')} AND status = 'running'"
        return (
            f"UPDATE flowkit_runs SET updated_at = {greatest}(updated_at, {p('now')}),"
            f" last_seq = last_seq + {p('n')} WHERE {where} RETURNING id, last_seq"
        )

    def update(self, columns: Sequence[str]) -> str:
        """``UPDATE`` of ``columns`` (by run id); JSON columns take text."""
        key = tuple(columns)
        sql = self._updates.get(key)
        if sql is None:
            sets = ", ".join(f"{c} = {self.j(c) if c in JSON_COLS else self.p(c)}" for c in key)
            sql = f"UPDATE flowkit_runs SET {sets} WHERE id = {self.p('id')}"
            self._updates[key] = sql
        return sql

    # -- commit: one conditional UPDATE ... RETURNING -----------------------------------------
    def commit_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], bool] | None:
        """The whole of a commit's run-row change as one ``UPDATE ... WHERE <lease and status
        preconditions> RETURNING``, or ``None`` when the update needs the general path (a
        signal to consume, notify-on-release). A row that does not match (a failed
        precondition, or a terminal commit of an admitted run, whose tags change) comes back
        empty: the caller then takes the general path, which decides and raises. The flag:
        the statement inserts the events too (``CTE_WRITES``)."""
        if u.consume_signal is not None or u.notify is not None or u.revives:
            return None
        shape, params, inline = self.commit_shape(run_id, owner, now, u)
        sql = self._commits.get(shape)
        if sql is None:
            sql = self.commit_sql(shape)
            if inline:
                sql = self.with_events(sql, len(u.events))
            if shape[-1] <= 16:
                self._commits[shape] = sql
        return sql, params, inline

    def commit_shape(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
        """``commit_fast``'s statement shape (what ``commit_sql`` builds from), parameters,
        and whether the events are inserted by the statement."""
        status = u.status
        terminal = status is not None and not status.active
        ws = None if terminal else u.waiting_signals
        wake_set = not terminal and u.wake_at is not UNSET
        owner_mode = 0 if owner is not None else (2 if u.ignore_lease else 1)
        n = len(u.events)
        inline = self.CTE_WRITES
        shape = (
            None if status is None else (status is RunStatus.SUSPENDED, terminal),
            u.output is not UNSET,
            u.error is not UNSET,
            wake_set,
            None if ws is None else bool(ws),
            u.attempt is not None,
            u.release_lease,
            n > 0,
            owner_mode,
            u.expect_status,
            n if inline else 0,
        )
        params: dict[str, Any] = {"id": run_id, "now": now}
        if status is not None:
            params["status"] = status.value
        if u.output is not UNSET:
            params["output"] = dumps(u.output)
        if u.error is not UNSET:
            params["error"] = dumps(u.error)
        if wake_set:
            params["wake_at"] = u.wake_at
        if ws is not None:
            params["ws"] = dumps(list(ws))
            if ws:
                params["ws_names"] = self.in_list_param(ws)
        if u.attempt is not None:
            params["attempt"] = u.attempt
        if n:
            params["n"] = n
        if owner is not None:
            params["owner"] = owner
        if self.namespace is not None:
            params["ns"] = self.namespace
        inline = inline and n > 0
        if inline:  # the seqs are the statement's: bodies get theirs in the database
            event_params(params, 0, u.events)
            for i in range(n):
                del params[f"s{i}"]
        return shape, params, inline

    def commit_sql(self, shape: tuple[Any, ...], *, releasing: bool = False) -> str:
        """The ``UPDATE`` of ``commit_fast`` for ``shape``; with ``releasing`` (a terminal
        commit of the lean releases) it also drops the run's admission marker."""
        st, has_output, has_error, wake_set, ws, has_attempt, release, events, owner_mode, exp = (
            shape[:10]
        )
        p, j = self.p, self.j
        sets = [f"updated_at = {p('now')}"]
        terminal = st is not None and st[1]
        if st is not None:
            # a non-terminal status never replaces a (sticky) cancelling one
            sets.append(
                f"status = {p('status')}"
                if terminal
                else f"status = CASE WHEN status = 'cancelling' THEN status ELSE {p('status')} END"
            )
        if has_output:
            sets.append(f"output = {j('output')}")
        if has_error:
            sets.append(f"error = {j('error')}")
        if terminal:
            sets += [
                "wake_at = NULL",
                "lease_owner = NULL",
                "lease_expires = NULL",
                f"waiting_signals = {self.EMPTY_LIST}",
            ]
        else:
            wake: str | None = None
            if wake_set:
                wake = p("wake_at")
                if st is not None and st[0]:  # suspend of a cancelling run: deliver it at once
                    wake = f"CASE WHEN status = 'cancelling' THEN {p('now')} ELSE {wake} END"
            if ws is not None:
                sets.append(f"waiting_signals = {j('ws')}")
                if ws:  # a signal it waits for arrived while it ran: due now
                    sigs = (
                        f"SELECT 1 FROM flowkit_signals WHERE run_id = flowkit_runs.id"
                        f" AND {self.in_list('name', 'ws_names')}"
                    )
                    wake = f"CASE WHEN EXISTS ({sigs}) THEN {p('now')} ELSE {wake or 'wake_at'} END"
            if wake is not None:
                sets.append(f"wake_at = {wake}")
            if release:
                sets += ["lease_owner = NULL", "lease_expires = NULL"]
        if has_attempt:
            sets.append(f"attempt = {p('attempt')}")
        if events:
            sets.append(f"last_seq = last_seq + {p('n')}")
        where = [f"id = {p('id')}{self.ns}"]
        if owner_mode == 0:
            where.append(f"lease_owner = {p('owner')}")
        elif owner_mode == 1:
            where.append(f"NOT {leased(p('now'))}")
        if exp is not None:
            where.append(f"status IN ({', '.join(sorted(repr(s.value) for s in exp))})")
        if releasing:
            sets += self.drop_marker()
        elif terminal:
            where.append("NOT admitted")  # releasing a slot rewrites the tags: general path
        return (
            f"UPDATE flowkit_runs SET {', '.join(sets)} WHERE {' AND '.join(where)}"
            f" RETURNING {self.COLS}"
        )

    def release_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any]] | None:
        """PostgreSQL: a common release as one statement (``PgStatements``); else ``None``."""
        return None

    def release_lite(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """SQLite: a common release in few statements (``SqliteStatements``); else ``None``."""
        return None

    # -- singleton keys -----------------------------------------------------------------------
    def locked_with_sharing(
        self, run_id: str, workflow: str, tag: str, waiters: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """One statement: the run's row, locked (first column ``0``), and the active runs of
        ``workflow`` carrying ``tag`` (``1``, as ``sharing``): what an admission or a release
        reads, in one round trip. With ``waiters`` (a singleton tag): only the key's holders
        and its ``waiters`` oldest waiters, all that decides when at most ``waiters`` slots can
        be free (``flowkit.singleton``): a long queue costs a release what a short one does."""
        q, params = self.sharing(workflow, tag)
        params = {**params, "id": run_id}
        truncated = waiters is not None and tag.startswith(SINGLETON_TAG_PREFIX)
        if truncated:
            params["n"] = waiters
        key = f"{q}|{truncated}"
        sql = self._cache_text.get(key)
        if sql is None:
            head = f"WITH h AS ({self.get_run_locked}) SELECT 0 AS k, h.* FROM h"
            if truncated:
                # the holders: a range of ix_flowkit_runs_queue; the first waiters: of the
                # partial ix_flowkit_runs_waiting, whose predicate the query repeats
                sql = (
                    f"{head} UNION ALL SELECT 1 AS k, a.* FROM ({self.key_holders(q)}"
                    f" AND admitted = {self.TRUE}) AS a"
                    f" UNION ALL SELECT 1 AS k, w.* FROM ({self.waiters()}"
                    f" LIMIT {self.p('n')}) AS w"
                )
            else:
                sql = f"{head} UNION ALL SELECT 1 AS k, s.* FROM ({q}) AS s"
            if len(self._cache_text) < 64:
                self._cache_text[key] = sql
        return sql, params

    def arm_heads(self) -> str:
        """``singleton.heads_to_arm`` as one statement: the ``n`` oldest waiters of the key
        ``key`` of workflow ``wf`` (the first entries of ``ix_flowkit_runs_waiting``) that
        are parked without a re-check due by ``at`` get ``wake_at = at``. PostgreSQL skips
        a row another transaction holds (``unless_locked``; a lock-order cycle otherwise) and
        returns how many heads it skipped (``SKIPS``): its caller arms them once it
        committed (``Commits.arm_skipped``)."""
        p = self.p
        cond = (
            f"id IN (SELECT h.id FROM ({self.waiters()} LIMIT {p('n')}) AS h)"
            f" AND status = 'suspended' AND (wake_at IS NULL OR wake_at > {p('at')})"
        )
        return f"UPDATE flowkit_runs SET wake_at = {p('at')} WHERE id IN ({self._heads(cond)})"

    def _heads(self, cond: str) -> str:
        """The ids of the rows ``cond`` selects, those another transaction holds left out
        (PostgreSQL: ``unless_locked``)."""
        lock = " FOR UPDATE SKIP LOCKED" if self.FOR_UPDATE else ""
        return f"SELECT id FROM flowkit_runs WHERE {cond}{lock}"

    def arm_heads_waiting(self) -> str:
        """``arm_heads``, but waiting for a head's row that another transaction holds, the
        rows locked in run-id order (``Commits.arm_skipped``: in a transaction that holds no
        other row, after the key's advisory lock, so it closes no lock-order cycle)."""
        p = self.p
        cond = (
            f"id IN (SELECT h.id FROM ({self.waiters()} LIMIT {p('n')}) AS h)"
            f" AND status = 'suspended' AND (wake_at IS NULL OR wake_at > {p('at')})"
        )
        return (
            f"UPDATE flowkit_runs SET wake_at = {p('at')} WHERE id IN"
            f" (SELECT id FROM flowkit_runs WHERE {cond} ORDER BY {self.BY_ID}{self.FOR_UPDATE})"
        )

    def arm_params(self, workflow: str, tag: str, n: int | None, at: float) -> dict[str, Any]:
        """The parameters of ``arm_heads`` for ``tag`` (a singleton tag) and ``n`` heads (one
        when the limit is unknown)."""
        params: dict[str, Any] = {"wf": workflow, "key": tag[len(SINGLETON_TAG_PREFIX) :]}
        if self.namespace is not None:
            params["ns"] = self.namespace
        params.update(n=1 if n is None else n, at=at)
        return params

    def waiters(self) -> str:
        """The waiters of the key ``key`` of workflow ``wf``, oldest first (before any filter
        on their tags): the first entries of the partial index ``ix_flowkit_runs_waiting``,
        which does not hold the key's settled runs."""
        return (
            f"SELECT {self.COLS} FROM flowkit_runs{self.WAITING_INDEX} WHERE workflow ="
            f" {self.p('wf')} AND singleton_key = {self.p('key')}{self.ns}"
            f" AND admitted = {self.FALSE} AND {WAITING_SQL} ORDER BY created_at, {self.BY_ID}"
        )

    def sharing(self, workflow: str, tag: str) -> tuple[str, dict[str, Any]]:
        """The active runs of ``workflow`` carrying ``tag`` (for a singleton tag exactly the
        rows of one key, through ``ix_flowkit_runs_singleton``)."""
        params: dict[str, Any] = {"wf": workflow}
        if self.namespace is not None:
            params["ns"] = self.namespace
        if tag.startswith(SINGLETON_TAG_PREFIX):
            params["key"] = tag[len(SINGLETON_TAG_PREFIX) :]
            return self.sharing_key, params
        if tag == ADMITTED_TAG:
            return self.sharing_admitted, params
        self.tag_params(params, tag)
        return self.sharing_tag, params


__all__ = [
    "ACTIVE",
    "DUE",
    "HANDABLE",
    "LOST",
    "NAMES",
    "Statements",
    "claimable",
    "common_release",
    "leased",
]
