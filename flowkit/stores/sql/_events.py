"""``SqlStore``'s published events (``Events``, mixed into it; ``base.PublishesEvents``): the
tables ``flowkit_event_waits``, ``flowkit_event_buffer`` and ``flowkit_published_events``
(``_schema``). Each call is one transaction of its own that first takes the event name's
advisory lock (PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` holds the whole database already): a
publish and a waiter's registration are serialized, so each sees the other's outcome, and an
event is delivered or buffered, never lost between "nobody waits" and "buffered"."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..._core.run import Run, RunStatus
from ...errors import RunNotFoundError
from .. import limits as _limits
from ..base import PublishedEvent, TakenEvent, event_mark
from ..codec._mark import CodecMark
from ._commit import wake_if_free
from ._connection import Conn
from ._group_commit import GroupCommit
from ._ops import Op
from ._rows import dumps, loads, to_run
from ._statements import Statements

LOCK_PREFIX = "flowkit.event:"
"""The advisory lock of an event name: ``LOCK_PREFIX + name``."""


def _matches(match: dict[str, str], keys: dict[str, str]) -> bool:
    return all(keys.get(k) == v for k, v in match.items())


class _Sql:
    """The statements of the published-event calls, in one dialect's spelling."""

    def __init__(self, sql: Statements) -> None:
        p, j, t = sql.p, sql.j, sql.TEXT
        self.remember = (
            "INSERT INTO flowkit_published_events (namespace, event_id, name, at)"
            f" VALUES ({p('evns')}, {p('eid')}, {p('name')}, {p('now')})"
            " ON CONFLICT (namespace, event_id) DO NOTHING"
        )
        self.waiters = (
            f"SELECT w.id, w.run_id, w.pos, w.match{t}, r.status FROM flowkit_event_waits w"
            " LEFT JOIN flowkit_runs r ON r.id = w.run_id"
            f" WHERE w.namespace = {p('evns')} AND w.name = {p('name')}"
            " AND w.event_id IS NULL ORDER BY w.id"
        )
        self.drop_wait = f"DELETE FROM flowkit_event_waits WHERE id = {p('wid')}"
        self.mark = (
            "INSERT INTO flowkit_signals (run_id, name, payload)"
            f" VALUES ({p('id')}, {p('name')}, {j('payload')}) RETURNING id"
        )
        self.delivered = (
            f"UPDATE flowkit_event_waits SET event_id = {p('eid')}, payload = {j('payload')},"
            f" mark = {p('mark')}, keys = {j('keys')} WHERE id = {p('wid')}"
        )
        self.dropped = (
            f"DELETE FROM flowkit_event_waits WHERE run_id = {p('id')} AND pos = {p('pos')}"
            f" RETURNING namespace, name, event_id, payload{t}, mark, keys{t}"
        )
        self.buffer = (
            "INSERT INTO flowkit_event_buffer (namespace, name, event_id, keys, payload, at)"
            f" VALUES ({p('evns')}, {p('name')}, {p('eid')}, {j('keys')}, {j('payload')},"
            f" {p('now')})"
        )
        self.wait_of = (
            f"SELECT id, event_id, payload{t}, mark FROM flowkit_event_waits"
            f" WHERE run_id = {p('id')} AND pos = {p('pos')}"
        )
        self.buffered = (
            f"SELECT id, event_id, keys{t}, payload{t} FROM flowkit_event_buffer"
            f" WHERE namespace = {p('evns')} AND name = {p('name')} ORDER BY id"
        )
        self.unbuffer = f"DELETE FROM flowkit_event_buffer WHERE id = {p('bid')}"
        self.register = (
            "INSERT INTO flowkit_event_waits (run_id, pos, namespace, name, match)"
            f" VALUES ({p('id')}, {p('pos')}, {p('evns')}, {p('name')}, {j('match')})"
            " RETURNING id"
        )


class Events:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_sql``, ``_gc``, ``_mark`` and
    ``max_payload_bytes``)."""

    namespace: str | None
    max_payload_bytes: int
    _sql: Statements
    _gc: GroupCommit
    _mark: CodecMark
    _ev: _Sql | None = None

    publishes_events = True
    """``publish_event``/``take_event`` (``flowkit.stores.base.PublishesEvents``)."""

    if TYPE_CHECKING:

        async def _plain(self, what: str, carries: Any, *args: Any) -> None: ...

    def _ev_sql(self) -> _Sql:
        if self._ev is None:
            self._ev = _Sql(self._sql)
        return self._ev

    async def _own_tx(self, op: Op[Any]) -> Any:
        """``op`` in a write transaction of its own (never batched with other calls: it
        takes its event name's lock and then run rows, in run-id order)."""
        gc = self._gc
        return await gc.call(functools.partial(gc.run_write, op), read=False)

    async def publish_event(
        self, name: str, payload: Any, event_id: str, keys: dict[str, str], now: float
    ) -> PublishedEvent:
        if not self._mark.settled and payload is not None:
            await self._plain(f"publish event {name!r} with a payload", bool, True)
        _limits.check_event(name, event_id, payload, self.max_payload_bytes)
        ev, sql = self._ev_sql(), self._sql
        ns = self.namespace or ""
        body = dumps(payload)

        def op(c: Conn, _: Any) -> PublishedEvent:
            if not c.write(ev.remember, {"evns": ns, "eid": event_id, "name": name, "now": now}):
                return PublishedEvent(event_id, duplicate=True)
            hits = _offer(c, sql, ev, ns, name, event_id, body, dumps(keys), now)
            return PublishedEvent(event_id, delivered=hits, buffered=not hits)

        done: PublishedEvent = await self._own_tx(Op(op, None, name, locks=(LOCK_PREFIX + name,)))
        return done

    async def take_event(
        self,
        run_id: str,
        pos: str,
        name: str,
        match: dict[str, str],
        now: float,
        *,
        wait: bool = True,
    ) -> TakenEvent | None:
        ev, sql = self._ev_sql(), self._sql

        def op(c: Conn, _: Any) -> TakenEvent | None:
            row = c.one(sql.get_run, sql.params(id=run_id))
            if row is None:
                raise RunNotFoundError(run_id)
            ns = to_run(row).namespace or ""
            mine = c.one(ev.wait_of, {"id": run_id, "pos": pos})
            if mine is not None and mine[1] is not None:
                return TakenEvent(str(mine[1]), loads(mine[2]), int(mine[3]))
            for bid, eid, keys, body in c.all(ev.buffered, {"evns": ns, "name": name}):
                if not _matches(match, loads(keys)):
                    continue
                c.write(ev.unbuffer, {"bid": bid})
                if mine is not None:
                    wid = int(mine[0])
                else:
                    params = {"id": run_id, "pos": pos, "evns": ns, "name": name}
                    wid = int(c.returning(ev.register, {**params, "match": dumps(match)})[0])
                sig = _deliver(c, sql, ev, run_id, pos, wid, str(eid), body, keys, now)
                return TakenEvent(str(eid), loads(body), sig)
            if wait and mine is None:
                params = {"id": run_id, "pos": pos, "evns": ns, "name": name}
                c.returning(ev.register, {**params, "match": dumps(match)})
            elif not wait and mine is not None:
                c.write(ev.drop_wait, {"wid": mine[0]})
            return None

        taken: TakenEvent | None = await self._own_tx(
            Op(op, None, run_id, locks=(LOCK_PREFIX + name,))
        )
        return taken

    async def drop_event_wait(
        self, run_id: str, pos: str, name: str, now: float
    ) -> tuple[str, ...]:
        ev, sql = self._ev_sql(), self._sql

        def op(c: Conn, _: Any) -> tuple[str, ...]:
            row = c.returning(ev.dropped, {"id": run_id, "pos": pos})
            if row is None or row[2] is None or row[4] is None:
                return ()
            evns, ename, eid, body, mark, keys = row
            if not c.write(sql.consume_signal, {"sid": int(mark), "id": run_id}):
                return ()  # (received: the record of ``event_received`` consumed its mark)
            return _offer(c, sql, ev, str(evns), str(ename), str(eid), body, keys or "{}", now)

        dropped: tuple[str, ...] = await self._own_tx(
            Op(op, None, run_id, locks=(LOCK_PREFIX + name,))
        )
        return dropped


_LIVE = frozenset(s.value for s in RunStatus if s.active and s is not RunStatus.CANCELLING)
"""The statuses of a run that still receives events."""


def _offer(
    c: Conn,
    sql: Statements,
    ev: _Sql,
    ns: str,
    name: str,
    event_id: str,
    body: str,
    keys: str,
    now: float,
) -> tuple[str, ...]:
    """Deliver the event (``body``: its payload, ``keys``: its digests, both as stored JSON) to
    every registered waiter of ``name`` whose run is active and not cancelling and whose
    ``match`` matches (dropping the waiters of other runs), or, when none does, buffer it: the
    ids of the runs it reached. In the caller's transaction, under the name's lock."""
    digests = loads(keys)
    rows = c.all(ev.waiters, {"evns": ns, "name": name})
    hits: list[tuple[str, str, int]] = []
    for wid, rid, pos, match, status in rows:
        if status is None or status not in _LIVE:
            c.write(ev.drop_wait, {"wid": wid})  # (settled or cancelling: nothing)
        elif _matches(loads(match), digests):
            hits.append((str(rid), str(pos), int(wid)))
    for rid, pos, wid in sorted(hits):  # (row locks in run-id order)
        _deliver(c, sql, ev, rid, pos, wid, event_id, body, keys, now)
    if not hits:
        params = {"evns": ns, "name": name, "eid": event_id, "now": now}
        c.write(ev.buffer, {**params, "keys": keys, "payload": body})
    return tuple(h[0] for h in hits)


def _deliver(
    c: Conn,
    sql: Statements,
    ev: _Sql,
    run_id: str,
    pos: str,
    wid: int,
    event_id: str,
    body: str,
    keys: str,
    now: float,
) -> int:
    """Hand the event to the wait ``wid``: the run's inbox mark (a run suspended waiting for it
    becomes due now, with a wake-up), the event kept on the wait's row; the mark's id."""
    mark = event_mark(pos)
    row = c.returning(sql.deliver, sql.params(id=run_id, name=mark, now=now))
    sig = int(c.returning(ev.mark, {"id": run_id, "name": mark, "payload": "null"})[0])
    params = {"eid": event_id, "payload": body, "mark": sig, "keys": keys, "wid": wid}
    c.write(ev.delivered, params)
    if row is not None:
        run: Run = to_run(row)
        wake_if_free(c, run, now)
    return sig


__all__ = ["LOCK_PREFIX", "Events"]
