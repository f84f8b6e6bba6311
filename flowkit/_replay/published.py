"""``ctx.set_event`` (a published value, event ``event_set``) and ``ctx.wait_for_event`` (a
published event, ``event_received``): DESIGN §11."""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine, Generator
from typing import Any

from .. import _limits, _serde
from ..events import EventSet
from .guard import enter, made_on
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
    st: ActivationState, name: str, match: dict[str, Any] | None, timeout: float | None
) -> Coroutine[Any, Any, Any]:
    """``ctx.wait_for_event``: takes its position now; records ``EventReceived``."""
    raise NotImplementedError("ctx.wait_for_event (issue #22)")
