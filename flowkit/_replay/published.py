"""``ctx.set_event`` (a published value, event ``event_set``) and ``ctx.wait_for_event`` (a
published event, ``event_received``): docs/events.md."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from datetime import timedelta
from typing import Any

from .._core import limits as _limits
from .._core import serde as _serde
from .._core.event_keys import event_mark, match_keys
from .._core.limits import MAX_EVENT_NAME_LENGTH, identifier_problem
from ..errors import ConflictError, SerializationError, SignalTimeout
from ..events import EventReceived, EventSet, TimerFired, TimerStarted
from .branch import Branch
from .control_flow import _Evicted
from .guard import cancel_left, enter, made_on
from .state import ActivationState


def set_event(st: ActivationState, key: str, value: Any) -> Awaitable[None]:
    """``ctx.set_event``: takes its position now; records ``EventSet``.

    The call is done when it returns: on replay it finds its event at its position; live it
    defers the event (``ActivationState.defer``: written with the run's next write, before
    any further step function runs). Awaiting what it returns writes it at once. A value
    that cannot be stored raises ``SerializationError`` here, and nothing is recorded."""
    _limits.check_identifier("event key", key, _limits.MAX_EVENT_NAME_LENGTH, st.defn.name)
    br = made_on(st)
    pos = br.next_pos()
    enter(st, br, br.counter)  # (in its turn: no call made before it is left unawaited)
    br.depth -= 1
    evs = st.take(pos, "set_event", key)
    if evs:
        st.observe(evs[0])
        return Written(st)
    data = _serde.to_json(value, what=f"value of event {key!r}", max_bytes=st.max_payload_bytes)
    if st.replay_only:
        raise st.stop_replay(pos, "set_event")
    st.defer(EventSet(pos=pos, key=key, value=data, at=st.host.now()))
    return Written(st)


class Written:
    """What ``ctx.set_event`` returns: awaited, the deferred events are written now (the
    value is then readable by ``engine.get_event``); left alone, they go with the next write."""

    __slots__ = ("_st",)

    def __init__(self, st: ActivationState) -> None:
        self._st = st

    def __await__(self) -> Generator[Any, Any, None]:
        return self._flush().__await__()

    async def _flush(self) -> None:
        st = self._st
        br = st.branch()
        br.depth += 1  # (what the write yields is a ctx call's: see ``guard.Guard``)
        try:
            await st.flush()
        finally:
            br.depth -= 1


def wait_for_event(
    st: ActivationState,
    name: str,
    match: dict[str, Any] | None,
    timeout: float | timedelta | None,
) -> Coroutine[Any, Any, Any]:
    """``ctx.wait_for_event``: takes its position now; records ``EventReceived``. A bad
    ``name``, ``match`` or ``timeout`` raises ``ValueError`` at the call."""
    if identifier_problem(name, MAX_EVENT_NAME_LENGTH) is not None:
        raise ValueError(f"event name must be a non-empty string, got {name!r}")
    if match is not None and (
        not isinstance(match, dict) or not all(isinstance(k, str) for k in match)
    ):
        raise ValueError(f"match must be a dict with str keys, got {match!r}")
    secs = _limits.timeout("ctx.wait_for_event timeout=", timeout, workflow=st.defn.name)
    try:
        keys = match_keys(_serde.to_json(match, what="match") if match else None)
    except SerializationError as exc:
        raise ValueError(str(exc)) from None
    br = made_on(st)
    pos = br.next_pos()
    coro = run_wait_event(st, br, br.counter, pos, name, keys, secs)
    if br.counter == br.next:
        br.head = coro
    return coro


async def run_wait_event(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    name: str,
    match: dict[str, str],
    timeout: float | None,
) -> Any:
    """The event wait at ``pos`` (call ``idx`` of ``made_in``): the payload of the event the
    store delivered to it or took from its buffer for it (``take_event``), or
    ``SignalTimeout`` once ``timeout`` seconds have passed."""
    br = enter(st, made_in, idx)
    try:
        return await _wait_event_in(st, pos, name, match, timeout)
    except asyncio.CancelledError:
        cancel_left(st, br)
        if not st.tearing_down:  # (the run's cancellation: the wait is abandoned for good)
            await _abandon(st, pos, name)
        raise
    finally:
        br.depth -= 1


async def _abandon(st: ActivationState, pos: str, name: str) -> None:
    """The run's cancellation left the wait at ``pos``: drop its registration, so a later
    event goes to another waiter or the buffer instead of this dead wait, and offer again an
    event delivered to it and not received (``drop_event_wait``). Again on every replay that
    delivers the cancellation here: nothing then. A store failure stops the activation (the
    run is recovered, and the replay drops it again)."""
    try:
        await st.host.drop_event_wait(pos, name)
    except Exception as exc:
        st.store_error = exc
        st.evict()
        raise _Evicted() from exc


async def _wait_event_in(
    st: ActivationState, pos: str, name: str, match: dict[str, str], timeout: float | None
) -> Any:
    st.check_alive()
    evs = st.take(pos, "wait_for_event", name)
    for ev in evs:
        if isinstance(ev, EventReceived):
            st.observe(ev)
            return ev.payload
    timer = next((e for e in evs if isinstance(e, TimerStarted)), None)
    fired = next((e for e in evs if isinstance(e, TimerFired)), None)
    if fired is not None:
        st.observe(fired)
        raise SignalTimeout(name, timeout if timeout is not None else 0.0)
    while True:
        st.check_alive()
        if st.cancel_requested:
            raise asyncio.CancelledError()
        now = st.host.now()
        # the timer is due: the take is the last chance of a delivery, exclusive with the
        # timeout (``wait=False`` drops the registration when nothing came)
        due = timer is not None and timer.fire_at <= now
        try:
            got = await st.host.take_event(pos, name, match, wait=not due)
        except Exception as exc:
            st.store_error = exc
            st.evict()
            raise _Evicted() from exc
        if got is not None:
            ev = EventReceived(
                pos=pos, name=name, event_id=got.event_id, payload=got.payload, at=now
            )
            try:
                await st.record([ev], consume_signal=got.mark)
            except ConflictError as exc:
                # (its mark is gone: only a record of this very wait consumes it, so the
                # history moved on without this activation; stop, writing nothing more)
                st.store_error = exc
                st.evict()
                raise _Evicted() from exc
            return got.payload
        if due:
            await st.record([TimerFired(pos=pos, at=now)])
            raise SignalTimeout(name, timeout if timeout is not None else 0.0)
        if timeout is not None and timer is None:
            fire_at = _limits.check_due(
                "the timeout of wait_for_event", round(now + timeout, 6), st.defn.name
            )
            timer = TimerStarted(pos=pos, fire_at=fire_at, purpose="signal_timeout", at=now)
            await st.record([timer])
            if timer.fire_at <= now:
                continue  # (a zero timeout: one last take, then the timeout)
        await st.park(timer.fire_at if timer else None, event_mark(pos))
