"""``MemoryStore``'s published events (``base.PublishesEvents``): the waiters registered by
``ctx.wait_for_event``, the buffer of events nobody waited for, and the ids published so far.
Each call runs without awaiting, so on one event loop it is atomic, as the SQL stores'
transactions are (serialized per event name there)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..._core.run import InboxSignal, RunStatus
from .. import limits as _limits
from ..base import PublishedEvent, TakenEvent, event_mark
from ..codec._mark import refuse

if TYPE_CHECKING:
    from . import _Data


@dataclass
class EventWait:
    """A registered ``ctx.wait_for_event`` at ``pos`` of a run (``order``: when it came), or
    the event delivered to it (``event_id`` set; its inbox mark: ``mark``; its ``keys``, to
    offer it again should the wait be dropped before receiving it)."""

    namespace: str | None
    name: str
    match: dict[str, str]
    order: int
    event_id: str | None = None
    payload: Any = None
    mark: int | None = None
    keys: dict[str, str] = field(default_factory=dict)


@dataclass
class Buffered:
    """A published event no waiter matched, kept for the first later matching one."""

    namespace: str | None
    name: str
    event_id: str
    keys: dict[str, str]
    payload: Any
    at: float


@dataclass
class MemoryEventData:
    """The published-event state of a ``MemoryStore``'s data (shared by its scoped views)."""

    # (run id, pos) -> its wait
    waits: dict[tuple[str, str], EventWait] = field(default_factory=dict)
    buffer: list[Buffered] = field(default_factory=list)
    # (namespace, event id) -> when it was published (the dedupe)
    published: dict[tuple[str | None, str], float] = field(default_factory=dict)
    order: int = 0


def matches(match: dict[str, str], keys: dict[str, str]) -> bool:
    """A waiter's ``match`` digests are all among the event's ``keys`` digests."""
    return all(keys.get(k) == v for k, v in match.items())


class MemoryEvents:
    """Mixed into ``MemoryStore`` (which provides the data and the helpers used here)."""

    namespace: str | None
    max_payload_bytes: int
    _d: _Data
    _mark: Any

    if TYPE_CHECKING:
        from ..._core.run import Run

        def _get(self, run_id: str) -> Run: ...
        def _put(self, run: Run) -> None: ...
        def _guard(self) -> str | None: ...

    async def publish_event(
        self, name: str, payload: Any, event_id: str, keys: dict[str, str], now: float
    ) -> PublishedEvent:
        if not self._mark.settled and (found := self._guard()) is not None and payload is not None:
            raise refuse(found, f"publish event {name!r} with a payload")
        _limits.check_event(name, event_id, payload, self.max_payload_bytes)
        ed = self._d.events_data
        ns = self.namespace
        if (ns, event_id) in ed.published:
            return PublishedEvent(event_id, duplicate=True)
        ed.published[(ns, event_id)] = now
        delivered = self._offer(Buffered(ns, name, event_id, dict(keys), payload, now), now)
        return PublishedEvent(event_id, delivered=tuple(delivered), buffered=not delivered)

    def _offer(self, ev: Buffered, now: float) -> list[str]:
        """Deliver ``ev`` to every registered waiter of its name whose run is active and not
        cancelling and whose ``match`` matches (dropping the waiters of other runs), or, when
        none does, buffer it: the ids of the runs it reached."""
        ed = self._d.events_data
        delivered: list[str] = []
        waits = sorted(
            (
                (w.order, rid, pos, w)
                for (rid, pos), w in ed.waits.items()
                if w.namespace == ev.namespace and w.name == ev.name and w.event_id is None
            ),
            key=lambda t: t[0],
        )
        for _, rid, pos, w in waits:
            run = self._d.runs.get(rid)
            if run is None or not run.status.active or run.status is RunStatus.CANCELLING:
                del ed.waits[(rid, pos)]  # (a settled or cancelling waiter gets nothing)
                continue
            if not matches(w.match, ev.keys):
                continue
            self._deliver(rid, pos, w, ev, now)
            delivered.append(rid)
        if not delivered:
            ed.buffer.append(ev)
        return delivered

    def _deliver(self, run_id: str, pos: str, w: EventWait, ev: Buffered, now: float) -> None:
        """Hand the event to the wait: its inbox mark, and the run due when it parks on it."""
        mark = event_mark(pos)
        sig = InboxSignal(next(self._d.signal_ids), mark, None)
        self._d.inbox.setdefault(run_id, []).append(sig)
        w.event_id, w.payload, w.mark = ev.event_id, ev.payload, sig.id
        w.keys = dict(ev.keys)
        run = self._d.runs[run_id]
        if run.status is RunStatus.SUSPENDED and mark in run.waiting_signals:
            self._put(dataclasses.replace(run, wake_at=now, updated_at=now))

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
        run = self._get(run_id)
        ed = self._d.events_data
        w = ed.waits.get((run_id, pos))
        if w is not None and w.event_id is not None and w.mark is not None:
            return TakenEvent(w.event_id, w.payload, w.mark)
        ns = run.namespace
        for i, b in enumerate(ed.buffer):
            if b.namespace == ns and b.name == name and matches(match, b.keys):
                del ed.buffer[i]
                w = w or EventWait(ns, name, dict(match), ed.order)
                ed.waits[(run_id, pos)] = w
                self._deliver(run_id, pos, w, b, now)
                assert w.mark is not None
                return TakenEvent(b.event_id, b.payload, w.mark)
        if wait:
            if w is None:
                ed.order += 1
                ed.waits[(run_id, pos)] = EventWait(ns, name, dict(match), ed.order)
        elif w is not None:
            del ed.waits[(run_id, pos)]
        return None

    async def drop_event_wait(
        self, run_id: str, pos: str, name: str, now: float
    ) -> tuple[str, ...]:
        ed = self._d.events_data
        w = ed.waits.pop((run_id, pos), None)
        if w is None or w.event_id is None or w.mark is None:
            return ()
        inbox = self._d.inbox.get(run_id, [])
        idx = next((i for i, sig in enumerate(inbox) if sig.id == w.mark), None)
        if idx is None:
            return ()  # (received: the record of ``event_received`` consumed its mark)
        inbox.pop(idx)
        again = Buffered(w.namespace, w.name, w.event_id, w.keys, w.payload, now)
        return tuple(self._offer(again, now))


__all__ = ["Buffered", "EventWait", "MemoryEventData", "MemoryEvents", "matches"]
