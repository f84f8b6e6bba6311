"""``ctx.wait_for_update`` (event ``update_received``) and ``UpdateRequest.reply``
(``update_replied``): docs/updates.md.

An update waits in the run's inbox as a signal of a reserved name (``_updates.inbox_name``)
whose payload is ``{"update_id", "arg"}``; its receipt is recorded with the commit that
consumes it, as a signal's is, and its ``arg`` is rebuilt from JSON with the workflow's
``updates[name]`` type live and on replay alike. A reply is a write of its own: it is in the
history before ``engine.update`` can see it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from .._core import limits as _limits
from .._core import serde as _serde
from .._core.run import InboxSignal
from .._model.ctx import UpdateRequest
from .._model.payloads import inbox_name, received
from ..events import UpdateReceived, UpdateReplied
from .branch import Branch
from .guard import cancel_left, enter, made_on
from .state import ActivationState
from .waits import wait_inbox


def wait_for_update(
    st: ActivationState, runtime: Any, name: str, timeout: float | timedelta | None
) -> Coroutine[Any, Any, Any]:
    """``ctx.wait_for_update``: takes its position now; an ``UpdateRequest``."""
    _limits.check_identifier("update name", name, _limits.MAX_UPDATE_NAME_LENGTH, st.defn.name)
    secs = _limits.timeout("ctx.wait_for_update timeout=", timeout, workflow=st.defn.name)
    br = made_on(st)
    pos = br.next_pos()
    coro = run_wait_update(st, br, br.counter, pos, name, secs, runtime)
    if br.counter == br.next:
        br.head = coro
    return coro


def reply_update(st: ActivationState, upd: Any, value: Any) -> Coroutine[Any, Any, None]:
    """``UpdateRequest.reply``: takes its position now; records ``UpdateReplied``."""
    if not isinstance(upd, UpdateRequest):
        raise TypeError(f"reply() belongs to an UpdateRequest, got {upd!r}")
    if upd.replied:  # (the caller gets one answer: a second would race the first)
        raise RuntimeError(f"update {upd.name!r} ({upd.update_id}) was already replied to")
    br = made_on(st)
    pos = br.next_pos()
    coro = run_reply_update(st, br, br.counter, pos, upd, value)
    if br.counter == br.next:
        br.head = coro
    upd.replied = True
    return coro


async def run_wait_update(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    name: str,
    timeout: float | None,
    runtime: Any,
) -> UpdateRequest:
    """The update wait at ``pos`` (call ``idx`` of ``made_in``): the run's oldest update
    ``name``, or ``SignalTimeout`` once ``timeout`` seconds have passed."""
    br = enter(st, made_in, idx)
    try:
        got = await _wait_update_in(st, pos, name, timeout)
        arg = received(st.defn.updates, name, got.arg)
        return UpdateRequest(runtime, name, got.update_id, arg, pos)
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def _wait_update_in(
    st: ActivationState, pos: str, name: str, timeout: float | None
) -> UpdateReceived:
    def receipt(sig: InboxSignal, at: float) -> UpdateReceived:
        body = sig.payload if isinstance(sig.payload, dict) else {}
        update_id = str(body.get("update_id", sig.id))
        return UpdateReceived(pos=pos, name=name, update_id=update_id, arg=body.get("arg"), at=at)

    got = await wait_inbox(st, pos, "wait_for_update", name, inbox_name(name), timeout, receipt)
    assert isinstance(got, UpdateReceived)
    return got


async def run_reply_update(
    st: ActivationState, made_in: Branch, idx: int, pos: str, upd: UpdateRequest, value: Any
) -> None:
    """The reply at ``pos`` (call ``idx`` of ``made_in``) to ``upd``: recorded at once (a
    write of its own), found again on replay. A value that cannot be stored raises
    ``SerializationError`` in the body, and nothing is recorded."""
    br = enter(st, made_in, idx)
    try:
        st.check_alive()
        evs = st.take(pos, "update_reply", upd.update_id)
        if evs:
            st.observe(evs[0])
            return
        data = _serde.to_json(
            value, what=f"reply to update {upd.name!r}", max_bytes=st.max_payload_bytes
        )
        ev = UpdateReplied(
            pos=pos, name=upd.name, update_id=upd.update_id, value=data, at=st.host.now()
        )
        await st.record([ev])
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1
