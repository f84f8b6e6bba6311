"""The hot-path SQL of ``SqlStore``: statement text per dialect, executed on the DBAPI
connection (``sqlite3`` or ``psycopg``) without SQLAlchemy's statement compilation and result
processing, and the conversions between rows and ``Run``/``Event``.

Everything here is built once per store (``Sql``) and cached by shape: a call formats no SQL
on the common paths. Parameters are named (``:name`` on SQLite, ``%(name)s`` on PostgreSQL).

JSON columns hold JSON text on SQLite (``_schema._SQLiteJSON``) and ``jsonb`` on PostgreSQL;
values are serialized with orjson here and bound as text (cast to ``jsonb`` in the statement
on PostgreSQL). A ``None`` payload is stored as the JSON ``null``, as SQLAlchemy's ``JSON``
type does, so rows written by either path read back the same.

The claim rules mirror ``flowkit.stores.memory.claimable``/``due_time`` (as
``_rows.claimable_sql``/``due_time_sql`` do for SQLAlchemy); ``tests/test_sql_store.py``
compares them with MemoryStore on randomized run states."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..._history import Event, SingletonAdmitted, event_from_json, event_to_json
from ..._run import ACTIVE_STATUSES, ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from ..base import UNSET, Notify, Update
from ._schema import BY_ID, WAITING_SQL

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
    "last_seq",
)
"""The columns every run query returns, in ``Run`` field order (``last_seq`` last)."""
LAST_SEQ = RUN_COLS.index("last_seq")
JSON_COLS = frozenset({"input", "output", "error", "tags", "waiting_signals"})
_NAMES = ", ".join(RUN_COLS)
# PostgreSQL hands JSON columns back as text too, so any driver's rows convert the same way
_PG_SELECT = ", ".join(f"{c}::text" if c in JSON_COLS else c for c in RUN_COLS)
_STATUS = {s.value: s for s in RunStatus}
_ACTIVE = ", ".join(f"'{s}'" for s in sorted(s.value for s in ACTIVE_STATUSES))
_HANDABLE = "'pending', 'running', 'suspended'"  # memory.hand_off_ok
_ADMITTED_JSON = "'" + orjson.dumps([ADMITTED_TAG]).decode() + "'"  # (a SQL literal)
_PARAM = re.compile(r"%\((\w+)\)s")  # a named parameter of a PostgreSQL statement


def _renamed(sql: str, prefix: str) -> str:
    """``sql`` with its named parameters prefixed (``Sql.joined``)."""
    return _PARAM.sub(lambda m: f"%({prefix}{m.group(1)})s", sql)


def _common_release(u: Update, n: Notify) -> bool:
    """A release the one-statement (PostgreSQL) and the lean (SQLite) paths take: a terminal
    commit with its events (at most 16) and no signal to consume, notifying a ``limit=1``
    singleton key whose freed slot may be handed over (``Notify.claim_owner``)."""
    return (
        n.limit == 1
        and n.claim_owner is not None
        and (n.max_hand_offs is None or n.max_hand_offs >= 1)
        and u.consume_signal is None
        and u.status is not None
        and not u.status.active
        and 0 < len(u.events) <= 16
        and n.tag.startswith(SINGLETON_TAG_PREFIX)
    )


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads_text(value: Any) -> Any:
    return None if value is None else orjson.loads(value)


def _leased(now: str) -> str:
    """``Run.leased(now)``."""
    return f"(lease_owner IS NOT NULL AND lease_expires IS NOT NULL AND lease_expires > {now})"


def _claimable(now: str) -> str:
    """Mirror of ``memory.claimable``."""
    return (
        f"status IN ({_ACTIVE}) AND NOT {_leased(now)} AND (status IN ('pending', 'running')"
        f" OR (status = 'cancelling' AND wake_at IS NULL)"
        f" OR (wake_at IS NOT NULL AND wake_at <= {now}))"
    )


# Mirror of ``memory.due_time``.
_DUE = (
    "CASE WHEN lease_owner IS NOT NULL AND lease_expires IS NOT NULL THEN"
    " CASE WHEN status NOT IN ('pending', 'running') AND wake_at IS NOT NULL"
    " AND wake_at > lease_expires THEN wake_at ELSE lease_expires END"
    " WHEN status = 'pending' THEN created_at"
    " WHEN status = 'running' OR (status = 'cancelling' AND wake_at IS NULL) THEN updated_at"
    " ELSE wake_at END"
)


class Sql:
    """The statements of one store (one dialect, one namespace) and the row conversions."""

    def __init__(self, dialect: str, namespace: str | None) -> None:
        self.dialect = dialect
        self.namespace = namespace
        pg = dialect == "postgresql"
        self.pg = pg
        # FIFO ties and every other order of run ids: code points, as in Python
        self.by_id = by_id = BY_ID[dialect]
        self.loads: Callable[[Any], Any] = _loads_text
        self.cols = cols = _PG_SELECT if pg else _NAMES
        ns = f" AND namespace = {self.p('ns')}" if namespace is not None else ""
        self.ns = ns
        p, j = self.p, self.j
        self.get_run = f"SELECT {cols} FROM flowkit_runs WHERE id = {p('id')}{ns}"
        self.get_run_locked = self.get_run + (" FOR UPDATE" if pg else "")
        self.get_any_run = f"SELECT {cols} FROM flowkit_runs WHERE id = {p('id')}"
        # one statement: no rows for an unknown run, one row of NULLs for a run without events
        self.load_events = (
            f"SELECT e.seq, e.body{'::text' if pg else ''} FROM flowkit_runs r"
            f" LEFT JOIN flowkit_events e ON e.run_id = r.id"
            f" WHERE r.id = {p('id')}{ns.replace('namespace', 'r.namespace')} ORDER BY e.seq"
        )
        self.insert_run = (
            f"INSERT INTO flowkit_runs ({_NAMES}, admitted) VALUES ("
            + ", ".join(j(c) if c in JSON_COLS else p(c) for c in RUN_COLS)
            + f", {p('admitted')})"
        )
        self.insert_run_new = self.insert_run + " ON CONFLICT (id) DO NOTHING"
        self.claim = (
            f"UPDATE flowkit_runs SET"
            f" status = CASE WHEN status = 'cancelling' THEN status ELSE 'running' END,"
            f" wake_at = NULL, lease_owner = {p('owner')}, lease_expires = {p('until')},"
            f" updated_at = {p('now')}"
            f" WHERE id = {p('id')}{ns} AND {_claimable(p('now'))} RETURNING {cols}"
        )
        self.renew = (
            f"UPDATE flowkit_runs SET lease_expires = {p('until')}"
            f" WHERE id = {p('id')}{ns} AND lease_owner = {p('owner')} AND status IN ({_ACTIVE})"
            f" RETURNING {cols}"
        )
        self.release_owned = (
            f"UPDATE flowkit_runs SET lease_owner = NULL, lease_expires = NULL,"
            f" updated_at = {p('now')}"
            f" WHERE lease_owner = {p('owner')}{ns} AND status IN ({_ACTIVE}) RETURNING id"
        )
        member = (
            f"waiting_signals ? {p('name')}"
            if pg
            else f"EXISTS (SELECT 1 FROM json_each(waiting_signals) WHERE value = {p('name')})"
        )
        wakes = f"status = 'suspended' AND {member}"
        self.deliver = (
            f"UPDATE flowkit_runs SET"
            f" wake_at = CASE WHEN {wakes} THEN {p('now')} ELSE wake_at END,"
            f" updated_at = CASE WHEN {wakes} THEN {p('now')} ELSE updated_at END"
            f" WHERE id = {p('id')}{ns} RETURNING {cols}"
        )
        self.deliver_and_insert = (
            f"WITH u AS ({self.deliver}), s AS (INSERT INTO flowkit_signals (run_id, name, payload)"
            f" SELECT u.id, {p('name')}, {j('payload')} FROM u) SELECT * FROM u"
        )
        self.insert_signal = (
            f"INSERT INTO flowkit_signals (run_id, name, payload)"
            f" VALUES ({p('id')}, {p('name')}, {j('payload')})"
        )
        self.peek_signal = (
            f"SELECT id, name, payload{'::text' if pg else ''} FROM flowkit_signals"
            f" WHERE run_id = {p('id')} AND name = {p('name')} ORDER BY id LIMIT 1"
        )
        self.consume_signal = (
            f"DELETE FROM flowkit_signals WHERE id = {p('sid')} AND run_id = {p('id')}"
        )
        self.signal_names = (
            f"SELECT DISTINCT name FROM flowkit_signals"
            f" WHERE run_id = {p('id')} AND {self.in_list('name', 'names')}"
        )
        due_where = f"{_claimable(p('now'))}{ns}"
        due_tail = f" ORDER BY {_DUE}, created_at, {by_id} LIMIT {p('limit')}"
        self.due_runs = f"SELECT {cols} FROM flowkit_runs WHERE {due_where}{due_tail}"
        self.due_runs_of = (
            f"SELECT {cols} FROM flowkit_runs WHERE {due_where}"
            f" AND {self.in_list('workflow', 'wfs')}{due_tail}"
        )
        nda = f"SELECT {cols} FROM flowkit_runs WHERE status IN ({_ACTIVE}){ns}"
        nda += f" AND ({_DUE}) IS NOT NULL"
        self.next_due = f"{nda} ORDER BY {_DUE} LIMIT 1"
        skip = f" AND (lease_owner IS NULL OR NOT {self.in_list('lease_owner', 'skip')})"
        self.next_due_skip = f"{nda}{skip} ORDER BY {_DUE} LIMIT 1"
        # next_due_after: only instants later than `now` (what is due already is not a deadline)
        later = f" AND ({_DUE}) > {p('now')}"
        self.next_due_after = f"{nda}{later} ORDER BY {_DUE} LIMIT 1"
        self.next_due_after_skip = f"{nda}{later}{skip} ORDER BY {_DUE} LIMIT 1"
        sharing = f"SELECT {cols} FROM flowkit_runs WHERE workflow = {p('wf')}"
        sharing += f" AND status IN ({_ACTIVE}){ns}"
        self.sharing_key = f"{sharing} AND singleton_key = {p('key')}"
        self.count_key = (
            f"SELECT count(*) FROM flowkit_runs WHERE workflow = {p('wf')}"
            f" AND status IN ({_ACTIVE}){ns} AND singleton_key = {p('key')}"
        )
        self.sharing_admitted = f"{sharing} AND admitted"
        self.sharing_tag = sharing + (
            f" AND tags @> {p('tags')}::jsonb"
            if pg
            else f" AND EXISTS (SELECT 1 FROM json_each(tags) WHERE value = {p('tag')})"
        )
        self.lock_key = "SELECT pg_advisory_xact_lock(hashtextextended(%(k)s, 0))"
        # A release locks its own row, then the waiter's. On PostgreSQL another process's group
        # commit may hold the waiter's row and wait for the releaser's (a lock-order cycle):
        # a locked waiter is skipped instead (a miss: it admits itself at its re-check).
        hand_if = (
            f"id = {p('id')} AND status IN ({_HANDABLE}) AND NOT admitted"
            f" AND NOT {_leased(p('now'))}"
        )
        wake_if = f"id = {p('id')} AND status = 'suspended'"
        if pg:
            hand_if = f"id = (SELECT id FROM flowkit_runs WHERE {hand_if} FOR UPDATE SKIP LOCKED)"
            wake_if = f"id = (SELECT id FROM flowkit_runs WHERE {wake_if} FOR UPDATE SKIP LOCKED)"
        # (the hand-off takes the seq of the waiter's ``singleton_admitted``, which the same
        # transaction appends: ``admitted_event`` and the statements built on ``handing``)
        self.hand_off = (
            f"UPDATE flowkit_runs SET tags = {j('tags')}, admitted = {p('admitted')},"
            f" status = 'running', wake_at = NULL, lease_owner = {p('owner')},"
            f" lease_expires = {p('until')}, updated_at = {p('now')}, last_seq = last_seq + 1"
            f" WHERE {hand_if} RETURNING {cols}"
        )
        self.wake_waiter = f"UPDATE flowkit_runs SET wake_at = {p('now')} WHERE {wake_if}"
        # a hand-off undone (the waiter's history cannot be read): its admission record goes
        self.drop_admitted = (
            f"DELETE FROM flowkit_events WHERE run_id = {p('id')} AND seq = {p('seq')}"
            f" AND type = 'singleton_admitted'"
        )
        self.unbump = f"UPDATE flowkit_runs SET last_seq = {p('seq')} - 1 WHERE id = {p('id')}"
        # PostgreSQL: the hand-off, its ``singleton_admitted`` and the waiter's history in one
        # statement (the run's columns, then each event's seq and body; no rows on a miss)
        self.hand_off_history = self.handing(f"h AS ({self.hand_off})")
        self._updates: dict[tuple[str, ...], str] = {}
        self._commits: dict[tuple[Any, ...], str] = {}
        self._cache: dict[tuple[str, int], str] = {}
        self._cache_text: dict[str, str] = {}
        self._joined: dict[tuple[tuple[str, ...], bool], str] = {}

    def handing(self, ctes: str) -> str:
        """PostgreSQL: ``ctes`` (which define ``h``, a hand-off's ``RETURNING``) followed by
        the insert of the handed waiter's ``singleton_admitted`` (body ``adm``, at the seq
        the hand-off took) and the select of the waiter's columns with its whole history."""
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

    @staticmethod
    def admitted_body(tag: str, now: float) -> str:
        """The JSON body of the ``singleton_admitted`` a hand-off appends (seq set by SQL)."""
        ev = SingletonAdmitted(key=tag[len(SINGLETON_TAG_PREFIX) :], at=now)
        return dumps(event_to_json(ev))

    # -- placeholders ---------------------------------------------------------------------
    def p(self, name: str) -> str:
        return f"%({name})s" if self.pg else f":{name}"

    def j(self, name: str) -> str:
        """A JSON parameter (bound as text)."""
        return f"%({name})s::jsonb" if self.pg else f":{name}"

    def in_list(self, column: str, name: str) -> str:
        """``column`` is one of the strings of the list parameter ``name`` (``in_list_param``
        gives its value)."""
        if self.pg:
            return f"{column} = ANY({self.p(name)})"
        return f"{column} IN (SELECT value FROM json_each({self.p(name)}))"

    def in_list_param(self, values: Sequence[str]) -> Any:
        return list(values) if self.pg else dumps(list(values))

    # -- rows -----------------------------------------------------------------------------
    def to_run(self, row: Sequence[Any]) -> Run:
        loads = self.loads
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
        )

    def run_params(self, run: Run, last_seq: int) -> dict[str, Any]:
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
            "last_seq": last_seq,
            "admitted": ADMITTED_TAG in run.tags,
        }

    def to_event(self, seq: int, body: Any) -> Event:
        data = self.loads(body)
        if not isinstance(data, dict):
            data = {"corrupt": data}  # event_from_json reports it as a HistoryError
        data["seq"] = seq
        return event_from_json(data)

    @staticmethod
    def event_params(params: dict[str, Any], first_seq: int, evs: Sequence[Event]) -> None:
        """The values of ``evs`` at ``first_seq``... as parameters ``s<i>``, ``t<i>``,
        ``a<i>``, ``b<i>`` (seq, type, at, body) of ``params``."""
        for i, ev in enumerate(evs):
            seq = first_seq + i
            body = event_to_json(ev)
            body["seq"] = seq
            params[f"s{i}"] = seq
            params[f"t{i}"] = ev.type
            params[f"a{i}"] = ev.at
            params[f"b{i}"] = dumps(body)

    def _values(self, n: int, *, seq: bool = True) -> str:
        p, j = self.p, self.j
        cast = "::float8" if self.pg else ""
        return ", ".join(
            f"({p(f's{i}') if seq else i}, {p(f't{i}')}, {p(f'a{i}')}{cast}, {j(f'b{i}')})"
            for i in range(n)
        )

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

    def create_with_events(self, n: int) -> str:
        """PostgreSQL: the run's ``INSERT ... ON CONFLICT DO NOTHING`` and its ``n`` events
        in one statement (one round trip); its row count is ``n`` when the run was created,
        0 when the id existed."""
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

    def _commit_with_events(self, update: str, n: int) -> str:
        """PostgreSQL: a commit's ``UPDATE ... RETURNING`` and the insert of its ``n`` events
        at the seqs it assigned (``last_seq`` of the updated row), in one statement; the rows
        are the update's (none when a precondition failed: then nothing was inserted)."""
        return f"WITH u AS ({update}), e AS ({self._events_of('u', n)}) SELECT * FROM u"

    def _events_of(self, cte: str, n: int) -> str:
        """PostgreSQL: the insert of ``n`` events (``event_params``, no seqs) of the run the
        query ``cte`` returned, at the seqs up to its new ``last_seq``."""
        seq = f"{cte}.last_seq - {n} + v.k + 1"
        return (
            f"INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT {cte}.id, {seq}, v.type, v.at, jsonb_set(v.body, '{{seq}}', to_jsonb({seq}))"
            f" FROM {cte}, (VALUES {self._values(n, seq=False)}) AS v(k, type, at, body)"
        )

    # -- append_events: a running step's record --------------------------------------------
    def append(self, n: int) -> tuple[str, bool]:
        """The statement of ``append_events`` of ``n`` events (``event_params``; no seqs) and
        whether it is the whole call. PostgreSQL: the row's ``UPDATE`` and the insert in one
        statement, returning ``(id, last_seq)``. SQLite, one event: one ``INSERT ... SELECT``
        from the run row, returning the seq (the ``flowkit_events_last_seq`` trigger moves
        ``last_seq`` and ``updated_at``); more events: the ``UPDATE ... RETURNING last_seq``,
        which the caller follows with the insert (``insert_events``) in its transaction. Either
        way a run not leased by ``owner``, or not ``running``, matches nothing."""
        key = ("append", n)
        sql = self._cache.get(key)
        if sql is None:
            p = self.p
            where = f"id = {p('id')}{self.ns} AND lease_owner = {p('owner')} AND status = 'running'"
            if not self.pg and n == 1:
                sql = (
                    f"INSERT INTO flowkit_events (run_id, seq, type, at, body)"
                    f" SELECT id, last_seq + 1, {p('t0')}, {p('a0')},"
                    f" json_set({p('b0')}, '$.seq', last_seq + 1)"
                    f" FROM flowkit_runs WHERE {where} RETURNING seq"
                )
            else:
                greatest = "GREATEST" if self.pg else "max"  # (never backwards)
                sql = (
                    f"UPDATE flowkit_runs SET updated_at = {greatest}(updated_at, {p('now')}),"
                    f" last_seq = last_seq + {p('n')} WHERE {where} RETURNING id, last_seq"
                )
                if self.pg:
                    sql = self._commit_with_events(sql, n)
            if n <= 16:
                self._cache[key] = sql
        return sql, self.pg or n == 1

    # -- writes of computed columns (the general paths) ------------------------------------
    def update(self, columns: Sequence[str]) -> str:
        """``UPDATE`` of ``columns`` (by run id); JSON columns take text."""
        key = tuple(columns)
        sql = self._updates.get(key)
        if sql is None:
            sets = ", ".join(f"{c} = {self.j(c) if c in JSON_COLS else self.p(c)}" for c in key)
            sql = f"UPDATE flowkit_runs SET {sets} WHERE id = {self.p('id')}"
            self._updates[key] = sql
        return sql

    @staticmethod
    def column_params(values: dict[str, Any]) -> dict[str, Any]:
        return {k: dumps(v) if k in JSON_COLS else v for k, v in values.items()}

    # -- commit: one conditional UPDATE ... RETURNING -----------------------------------
    def commit_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], bool] | None:
        """The whole of a commit's run-row change as one ``UPDATE ... WHERE <lease and status
        preconditions> RETURNING``, or ``None`` when the update needs the general path (a
        signal to consume, notify-on-release). A row that does not match (a failed
        precondition, or a terminal commit of an admitted run, whose tags change) comes back
        empty: the caller then takes the general path, which decides and raises. On
        PostgreSQL the statement also inserts the events (the flag says so): one round trip."""
        if u.consume_signal is not None or u.notify is not None:
            return None
        shape, params, inline = self._commit_shape(run_id, owner, now, u)
        sql = self._commits.get(shape)
        if sql is None:
            sql = self._commit_sql(shape)
            if inline:
                sql = self._commit_with_events(sql, len(u.events))
            if shape[-1] <= 16:
                self._commits[shape] = sql
        return sql, params, inline

    def _commit_shape(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[tuple[Any, ...], dict[str, Any], bool]:
        """``commit_fast``'s statement shape (what ``_commit_sql`` builds from), parameters,
        and whether the events are inserted by the statement (PostgreSQL)."""
        status = u.status
        terminal = status is not None and not status.active
        ws = None if terminal else u.waiting_signals
        wake_set = not terminal and u.wake_at is not UNSET
        owner_mode = 0 if owner is not None else (2 if u.ignore_lease else 1)
        n = len(u.events)
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
            n if self.pg else 0,
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
        inline = self.pg and n > 0
        if inline:  # the seqs are the statement's: bodies get theirs in the database
            self.event_params(params, 0, u.events)
            for i in range(n):
                del params[f"s{i}"]
        return shape, params, inline

    def _commit_sql(self, shape: tuple[Any, ...], *, releasing: bool = False) -> str:
        """The ``UPDATE`` of ``commit_fast`` for ``shape``; with ``releasing`` (a terminal
        commit: ``release_fast``, ``release_lite``) it also drops the run's admission marker
        (on SQLite its one occurrence: flowkit never writes it twice)."""
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
                "waiting_signals = '[]'::jsonb" if self.pg else "waiting_signals = '[]'",
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
            where.append(f"NOT {_leased(p('now'))}")
        if exp is not None:
            where.append(f"status IN ({', '.join(sorted(repr(s.value) for s in exp))})")
        if releasing:
            if self.pg:
                sets += [f"tags = tags - '{ADMITTED_TAG}'", "admitted = false"]
            else:  # (the marker's position in the array; an unmarked run keeps its tags)
                mark = (
                    f"SELECT fullkey FROM json_each(flowkit_runs.tags)"
                    f" WHERE value = '{ADMITTED_TAG}' LIMIT 1"
                )
                sets += [f"tags = coalesce(json_remove(tags, ({mark})), tags)", "admitted = 0"]
        elif terminal:
            where.append("NOT admitted")  # releasing a slot rewrites the tags: general path
        return (
            f"UPDATE flowkit_runs SET {', '.join(sets)} WHERE {' AND '.join(where)}"
            f" RETURNING {self.cols}"
        )

    # -- release: one statement ---------------------------------------------------------
    def release_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any]] | None:
        """PostgreSQL: the whole of a common release as one statement, or ``None`` when it
        needs the general path. Common: a terminal commit by the lease holder of a run of a
        ``limit=1`` key that hands the freed slot over (``Notify.claim_owner``). Its rows
        (``k``, then the run's columns, then an event's ``seq`` and ``body``):

        * ``k = 0``: the released run as it is now; no such row when a precondition failed
          (another lease owner, an unexpected status): then nothing was written;
        * ``k = 1``: the waiter the slot was handed to, one row per event of its history;
        * ``k = 2``: the waiter the slot was planned for, as it was before (``seq`` 1 when it
          could not be handed, being leased by another instance or blocked: then it was
          stamped due now, if it was parked and no other transaction held its row).

        It decides as ``memory.plan_release`` does over the key's rows: with no other
        holder, the oldest waiter by ``(created_at, id)`` (active, not admitted, not
        cancelling) is admitted and leased to ``claim_owner`` if ``hand_off_ok``, else only
        woken; if its row is locked by
        another transaction (``SKIP LOCKED``) it is neither handed nor woken here: the caller
        wakes it after the commit, as after a missed hand-off."""
        n = u.notify
        if not self.pg or n is None or owner is None or not _common_release(u, n):
            return None
        shape, params, _inline = self._commit_shape(run_id, owner, now, u)
        params["wf"] = n.workflow
        params["key"] = n.tag[len(SINGLETON_TAG_PREFIX) :]
        params["tagj"] = dumps([n.tag])
        params["cowner"] = n.claim_owner
        params["until"] = n.lease_expires
        params["adm"] = self.admitted_body(n.tag, now)
        key = ("release", *shape)
        sql = self._commits.get(key)
        if sql is None:
            sql = self._release_sql(shape)
            self._commits[key] = sql
        return sql, params

    def _release_sql(self, shape: tuple[Any, ...]) -> str:
        p, ns = self.p, self.ns
        now = p("now")
        # ``(status || '')``: a status test that is no index condition, so the planner (with
        # or without statistics) finds a waiter's row by its id, never by a scan of every run
        # with that status. The key's holders: a range of ix_flowkit_runs_queue
        # (``admitted = true``) or of ix_flowkit_runs_singleton; its oldest waiter: the first
        # entry of ix_flowkit_runs_waiting (its predicate repeated word for word), which does
        # not hold the key's settled runs (a long-lived key has many).
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

        handable = f"{status} IN ({_HANDABLE}) AND NOT {_leased(now)}"  # memory.hand_off_ok
        hand = waiter("w.handable", f"{handable} AND NOT admitted")
        wake = waiter("NOT w.handable", f"{status} = 'suspended'")
        waiter_cols = ", ".join(f"w.{c}" for c in RUN_COLS)
        return (
            f"WITH me AS ({self._commit_sql(shape, releasing=True)}),"
            f" e AS ({self._events_of('me', shape[-1])}),"
            f" free AS (SELECT NOT EXISTS (SELECT 1 {key_rows}"
            f" AND admitted = true AND status IN ({_ACTIVE})) AS ok),"
            # the oldest waiter (singleton.waiters: active, not admitted, not cancelling)
            f" w AS (SELECT {self.cols}, {handable} AS handable {key_rows}"
            f" AND admitted = false AND {WAITING_SQL} ORDER BY created_at, {self.by_id} LIMIT 1),"
            f" h AS (UPDATE flowkit_runs SET tags = tags || {_ADMITTED_JSON}::jsonb,"
            f" admitted = true, status = 'running', wake_at = NULL,"
            f" lease_owner = {p('cowner')}, lease_expires = {p('until')}, updated_at = {now},"
            f" last_seq = last_seq + 1 WHERE {hand} RETURNING {self.cols}),"
            # (the handed waiter's singleton_admitted, in this transaction)
            f" ev AS (INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT h.id, h.last_seq, 'singleton_admitted', h.updated_at,"
            f" jsonb_set({p('adm')}::jsonb, '{{seq}}', to_jsonb(h.last_seq)) FROM h"
            f" RETURNING run_id, seq, body),"
            f" wk AS (UPDATE flowkit_runs SET wake_at = {now}"
            f" WHERE {wake} RETURNING id)"
            f" SELECT 0 AS k, me.*, NULL::integer AS seq, NULL::text AS body FROM me"
            f" UNION ALL SELECT 1, h.*, e2.seq, e2.body::text FROM h"
            f" LEFT JOIN flowkit_events e2 ON e2.run_id = h.id"
            f" UNION ALL SELECT 1, h.*, ev.seq, ev.body::text FROM h JOIN ev ON ev.run_id = h.id"
            f" UNION ALL SELECT 2, {waiter_cols}, CASE WHEN w.handable THEN 0 ELSE 1 END, NULL"
            f" FROM w, free WHERE free.ok"
            f" ORDER BY k, seq"
        )

    # -- release: SQLite, four statements ---------------------------------------------------
    def release_lite(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """SQLite: a common release (as ``release_fast``'s) with little Python, or ``None``
        when it needs the general path. The statement returned is the releasing run's
        conditional ``UPDATE ... RETURNING`` (no row: a precondition failed and nothing was
        written); the parameters after it are those of ``release_waiter``, which reads the
        key's oldest waiter with its history once the run is released."""
        n = u.notify
        if self.pg or n is None or owner is None or not _common_release(u, n):
            return None
        shape, params, _inline = self._commit_shape(run_id, owner, now, u)
        key = ("release", *shape)
        sql = self._commits.get(key)
        if sql is None:
            sql = self._commit_sql(shape, releasing=True)
            self._commits[key] = sql
        waiter: dict[str, Any] = {
            "wf": n.workflow,
            "key": n.tag[len(SINGLETON_TAG_PREFIX) :],
            "tag": n.tag,
            "now": now,
        }
        if self.namespace is not None:
            waiter["ns"] = self.namespace
        return sql, params, waiter

    @functools.cached_property
    def release_waiter(self) -> str:
        """SQLite: the oldest waiter of a key (``singleton.waiters``: active, not admitted,
        not cancelling, by ``(created_at, id)``), its columns then whether it can be handed
        the slot (``memory.hand_off_ok``) and whether the key has no holder, then one row per
        event of its history (``seq``, ``body``; ``NULL`` for none). No rows: no waiter. The
        waiter is the first entry of ``ix_flowkit_runs_waiting``; a holder, of
        ``ix_flowkit_runs_queue``."""
        p, ns = self.p, self.ns
        carries = f"EXISTS (SELECT 1 FROM json_each(tags) WHERE value = {p('tag')})"
        key_rows = f"workflow = {p('wf')} AND singleton_key = {p('key')}{ns} AND {carries}"
        holders = (
            f"SELECT 1 FROM flowkit_runs WHERE {key_rows} AND admitted = 1"
            f" AND +status IN ({_ACTIVE})"
        )
        handable = f"status IN ({_HANDABLE}) AND NOT {_leased(p('now'))}"
        oldest = (
            f"SELECT {self.cols}, {handable} AS handable, NOT EXISTS ({holders}) AS free"
            f" FROM flowkit_runs INDEXED BY ix_flowkit_runs_waiting WHERE {key_rows}"
            f" AND admitted = 0 AND {WAITING_SQL} ORDER BY created_at, {self.by_id} LIMIT 1"
        )
        return (
            f"SELECT w.*, e.seq, e.body FROM ({oldest}) AS w"
            f" LEFT JOIN flowkit_events e ON e.run_id = w.id ORDER BY e.seq"
        )

    # -- singleton keys -------------------------------------------------------------------
    def locked_with_sharing(
        self, run_id: str, workflow: str, tag: str, waiters: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        """One statement: the run's row, locked (first column ``0``), and the active runs of
        ``workflow`` carrying ``tag`` (``1``, as ``sharing``). One round trip for what an
        admission or a release reads.

        With ``waiters`` (a singleton tag): only the key's holders and its ``waiters`` oldest
        waiters by ``(created_at, id)``, which is all that admission and notify-on-release
        decide on when at most ``waiters`` slots can be free (``flowkit.singleton``); a key
        with 10,000 queued runs costs a release what a key with a few does."""
        q, params = self.sharing(workflow, tag)
        params = {**params, "id": run_id}
        truncated = waiters is not None and tag.startswith(SINGLETON_TAG_PREFIX)
        if truncated:
            params["n"] = waiters
        key = f"{q}|{truncated}"
        sql = self._cache_text.get(key)
        if sql is None:
            head = f"WITH h AS ({self.get_run_locked}) SELECT 0 AS k, h.* FROM h"
            true = "true" if self.pg else "1"
            if truncated:
                # the holders: a range of ix_flowkit_runs_queue (``+status``: SQLite must not
                # prefer ix_flowkit_runs_singleton); the first waiters: of the partial
                # ix_flowkit_runs_waiting, whose predicate the query repeats word for word
                holders = q.replace(" status IN (", " +status IN (", 1) if not self.pg else q
                sql = (
                    f"{head} UNION ALL SELECT 1 AS k, a.* FROM ({holders}"
                    f" AND admitted = {true}) AS a"
                    f" UNION ALL SELECT 1 AS k, w.* FROM ({self._waiters()}"
                    f" LIMIT {self.p('n')}) AS w"
                )
            else:
                sql = f"{head} UNION ALL SELECT 1 AS k, s.* FROM ({q}) AS s"
            if len(self._cache_text) < 64:
                self._cache_text[key] = sql
        return sql, params

    def joined(
        self, parts: Sequence[tuple[str, dict[str, Any]]], *, handing: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """PostgreSQL: several writes of one call, each on rows none of the others writes, as
        one statement (its ``WITH`` queries; the parameters of part ``i`` renamed ``p<i>_``):
        the server parses, binds and runs one statement instead of several, and the client
        sends one. All parts see one snapshot and all run to completion. With ``handing``
        the last part is ``hand_off`` and the statement returns what ``hand_off_history``
        does."""
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

    def _waiters(self) -> str:
        """The waiters of the key ``key`` of workflow ``wf``, oldest first (before any filter
        on their tags): the first entries of the partial index ``ix_flowkit_runs_waiting``
        (SQLite is told to use it: it would otherwise pick ``ix_flowkit_runs_queue``, which
        holds the key's settled runs too)."""
        false = "false" if self.pg else "0"
        hint = "" if self.pg else " INDEXED BY ix_flowkit_runs_waiting"
        return (
            f"SELECT {self.cols} FROM flowkit_runs{hint} WHERE workflow = {self.p('wf')}"
            f" AND singleton_key = {self.p('key')}{self.ns}"
            f" AND admitted = {false} AND {WAITING_SQL} ORDER BY created_at, {self.by_id}"
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
        if self.pg:
            params["tags"] = dumps([tag])
        else:
            params["tag"] = tag
        return self.sharing_tag, params


__all__ = ["JSON_COLS", "LAST_SEQ", "RUN_COLS", "Sql", "dumps"]
