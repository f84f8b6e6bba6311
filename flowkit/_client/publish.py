"""Published values and events (docs/updates.md): ``Engine.get_event`` (a run's latest
``ctx.set_event`` value) and ``Engine.publish_event`` (fan-out to ``ctx.wait_for_event``
waiters, buffering, ``event_id`` dedupe, and the runs of ``@workflow(on_event=...)``)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .._core import limits as _limits
from .._core import serde as _serde
from .._core.event_keys import payload_keys
from .._core.run import Run
from ..errors import FlowkitError, InvalidInputError, SerializationError, UnsupportedStoreError
from ..events import EventSet
from ..stores import limits
from ..stores.base import PublishedEvent, publishes_events
from .history_wait import latest_event, wait_for_history

if TYPE_CHECKING:
    from .core import ClientCore
    from .engine import Engine

log = logging.getLogger("flowkit")


async def get_event(
    engine: Engine, core: ClientCore, run_id: str, key: str, timeout: float | timedelta | None
) -> Any:
    """``Engine.get_event``: the value of the run's newest ``event_set`` of ``key`` (as
    stored: JSON). None set yet: wait up to ``timeout`` real seconds (``None``: until one is
    set or the run settles) for the first, then ``None``; a settled run that never set it
    answers ``None`` at once. A run that continued as new is followed to its successors (the
    newest value any run of the chain set). ``RunNotFoundError`` for an unknown run."""
    limits.check_identifier("event key", key, limits.MAX_EVENT_NAME_LENGTH)
    secs = _limits.timeout("get_event timeout=", timeout)
    await core.get(run_id)  # (RunNotFoundError before any wait)
    # A run that continued as new (``Run.continued_as``) is followed along its chain, as
    # ``result`` follows it: the newest value set by any run of the chain wins.
    chain = [run_id]
    found: list[Any] = []  # (the newest value of the runs before chain[-1], if one was set)

    async def pick(run: Run) -> tuple[Any] | None:
        ev = await latest_event(engine.store, chain[-1], "event_set", "key", key)
        if run.status.terminal and run.continued_as is not None:
            if isinstance(ev, EventSet):  # (unless a successor sets a newer one)
                found.append(ev.value)
            chain.append(run.continued_as)  # (on to the successor: ``wait_for_history`` ends)
            return (_FOLLOW,)
        if isinstance(ev, EventSet):
            return (ev.value,)
        if found:
            return (found[-1],)
        if run.status.terminal or secs == 0:
            return (None,)
        return None

    try:
        # (``timeout=0``: one read a run, ``pick`` answers at once)
        async with asyncio.timeout(secs or None):
            while True:
                (value,) = await wait_for_history(engine.store, engine.bus, chain[-1], pick)
                if value is not _FOLLOW:
                    return value
    except TimeoutError:
        return found[-1] if found else None


_FOLLOW = object()
"""``get_event``'s pick: the run continued as new, read its successor."""


async def publish_event(
    engine: Engine, core: ClientCore, name: str, payload: Any, event_id: str | None
) -> PublishedEvent:
    """``Engine.publish_event``: checked first (name, id, payload: ``InvalidInputError``,
    nothing written); then the store delivers or buffers it in one atomic call
    (``PublishesEvents``), and the ``on_event`` workflows registered here each start one run
    ``evt:{event_id}:{workflow}`` (idempotent: again after a duplicate, so a publisher that
    died between the two finishes the starts by publishing again)."""
    limits.check_identifier("event name", name, limits.MAX_EVENT_NAME_LENGTH)
    if event_id is None:
        event_id = str(uuid.UUID(int=engine.config.rng.getrandbits(128), version=4))
    limits.check_identifier("event_id", event_id, limits.MAX_EVENT_NAME_LENGTH)
    for wf in _on_event(engine, name):  # (their run ids must fit: checked before writing)
        limits.check_identifier("run_id", _run_id(event_id, wf), limits.MAX_RUN_ID_LENGTH, wf)
    try:
        data = _serde.to_json(
            payload, what=f"payload of event {name!r}", max_bytes=engine.max_payload_bytes
        )
    except SerializationError as exc:
        raise InvalidInputError(None, str(exc)) from None
    store: Any = engine.store
    if not publishes_events(store):
        raise UnsupportedStoreError(f"{store!r} has no published events (publishes_events)")
    now = engine.clock.now()
    done: PublishedEvent = await store.publish_event(name, data, event_id, payload_keys(data), now)
    for rid in done.delivered:
        core.wake(rid)
    started = await _start_on_event(engine, name, event_id, data)
    if started:
        done = PublishedEvent(
            done.event_id, done.duplicate, done.delivered, done.buffered, tuple(started)
        )
    return done


def _on_event(engine: Engine, name: str) -> list[str]:
    """The workflows registered on ``engine`` whose newest version has ``on_event=name``."""
    reg = engine.registry
    return [wf for wf in reg.names() if (e := reg.get(wf)) is not None and e[0].on_event == name]


def _run_id(event_id: str, workflow: str) -> str:
    """The id of the run ``event_id`` starts for an ``on_event`` workflow (docs/events.md)."""
    return f"evt:{event_id}:{workflow}"


async def _start_on_event(engine: Engine, name: str, event_id: str, data: Any) -> list[str]:
    """Start one run per ``@workflow(on_event=name)`` registered on ``engine`` (its newest
    version). A payload one of them refuses as input (``InvalidInputError``) or a start that
    fails otherwise is logged and skipped: the delivery to the waiters stands, and publishing
    the same ``event_id`` again retries the starts."""
    started: list[str] = []
    for wf in _on_event(engine, name):
        run_id = _run_id(event_id, wf)
        try:
            await engine.start(wf, data, run_id)
        except FlowkitError as exc:
            log.warning("event %r (%s) did not start %s: %s", name, event_id, wf, exc)
            continue
        started.append(run_id)
    return started


__all__ = ["get_event", "publish_event"]
