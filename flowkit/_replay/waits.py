"""The durable waits: ``ctx.sleep``/``sleep_until`` (a timer) and ``ctx.wait_for_signal``
(the run's inbox, with an optional timeout timer). A wait this activation cannot end parks
(``ActivationState.park``); the run suspends and a later activation finds it ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .._core.limits import check_due
from .._core.run import InboxSignal
from .._model.payloads import received
from ..errors import ConflictError, SignalTimeout
from ..events import Event, SignalReceived, TimerFired, TimerStarted
from .branch import Branch
from .control_flow import _Evicted
from .guard import cancel_left, enter
from .matching import Call
from .state import ActivationState


async def run_sleep(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    fire_at: float | None,
    seconds: float | None,
) -> None:
    """The timer at ``pos`` (call ``idx`` of ``made_in``): it fires at ``fire_at``, or
    ``seconds`` after it is first run."""
    br = enter(st, made_in, idx)
    try:
        st.check_alive()
        evs = st.take(pos, "sleep", "sleep")
        started = next((e for e in evs if isinstance(e, TimerStarted)), None)
        fired = next((e for e in evs if isinstance(e, TimerFired)), None)
        if fired is not None:
            st.observe(fired)
            return
        if st.cancel_requested:  # (also a timer that is due by now: it did not fire)
            raise asyncio.CancelledError()
        if started is None:
            now = st.host.now()
            target = round(fire_at if fire_at is not None else now + (seconds or 0.0), 6)
            check_due("ctx.sleep", target, st.defn.name)  # (nothing recorded past year 9999)
            started = TimerStarted(pos=pos, fire_at=target, at=now)
            await st.record([started])
        if started.fire_at > st.host.now():
            await st.park(started.fire_at)
        await st.record([TimerFired(pos=pos, at=st.host.now())])
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def run_wait_signal(
    st: ActivationState, made_in: Branch, idx: int, pos: str, name: str, timeout: float | None
) -> Any:
    """The signal wait at ``pos`` (call ``idx`` of ``made_in``): the payload of the run's
    oldest signal ``name``, or ``SignalTimeout`` once ``timeout`` seconds have passed."""
    br = enter(st, made_in, idx)
    try:
        data = await _wait_signal_in(st, pos, name, timeout)
        # (the workflow's ``signals[name]`` type, rebuilt from JSON live and on replay)
        return received(st.defn.signals, name, data) if st.defn.signals else data
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def _wait_signal_in(st: ActivationState, pos: str, name: str, timeout: float | None) -> Any:
    def receipt(sig: InboxSignal, at: float) -> SignalReceived:
        return SignalReceived(pos=pos, name=name, payload=sig.payload, at=at)

    got = await wait_inbox(st, pos, "wait_for_signal", name, name, timeout, receipt)
    assert isinstance(got, SignalReceived)
    return got.payload


async def wait_inbox(
    st: ActivationState,
    pos: str,
    call: Call,
    name: str,
    inbox: str,
    timeout: float | None,
    receipt: Callable[[InboxSignal, float], Event],
) -> Event:
    """A wait at ``pos`` for the run's oldest inbox signal ``inbox`` (``ctx.wait_for_signal``,
    ``ctx.wait_for_update``): its receipt (``receipt(signal, now)``, recorded with the commit
    that consumes the signal, or found in the history), or ``SignalTimeout`` once ``timeout``
    seconds have passed (a ``signal_timeout`` timer at ``pos``)."""
    st.check_alive()
    evs = st.take(pos, call, name)
    for ev in evs:
        if not isinstance(ev, TimerStarted | TimerFired):
            st.observe(ev)
            return ev
    timer = next((e for e in evs if isinstance(e, TimerStarted)), None)
    fired = next((e for e in evs if isinstance(e, TimerFired)), None)
    if fired is not None:
        st.observe(fired)
        raise SignalTimeout(name, timeout if timeout is not None else 0.0)
    while True:
        st.check_alive()
        if st.cancel_requested:  # (before the inbox: a signal there is not taken)
            raise asyncio.CancelledError()
        try:
            sig = await st.host.peek_signal(inbox)
        except Exception as exc:
            st.store_error = exc
            st.evict()
            raise _Evicted() from exc
        if sig is not None:
            got = receipt(sig, st.host.now())
            try:
                await st.record([got], consume_signal=sig.id)
            except ConflictError:
                continue  # consumed by a racing activation; look again
            return got
        now = st.host.now()
        if st.cancel_requested:
            raise asyncio.CancelledError()
        if timeout is not None and timer is None:
            due = check_due(f"the timeout of {call}", round(now + timeout, 6), st.defn.name)
            timer = TimerStarted(pos=pos, fire_at=due, purpose="signal_timeout", at=now)
            await st.record([timer])
        if timer is not None and timer.fire_at <= now:
            await st.record([TimerFired(pos=pos, at=now)])
            raise SignalTimeout(name, timeout if timeout is not None else 0.0)
        await st.park(timer.fire_at if timer else None, inbox)
