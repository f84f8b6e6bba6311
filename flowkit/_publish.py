"""Published values and events (DESIGN §11): ``Engine.get_event`` (a run's latest
``ctx.set_event`` value) and ``Engine.publish_event`` (fan-out to ``ctx.wait_for_event``
waiters, buffering, ``event_id`` dedupe, and the runs of ``@workflow(on_event=...)``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ._history_wait import latest_event, wait_for_history
from ._run import Run
from .errors import InvalidInputError
from .events import EventSet
from .stores import limits

if TYPE_CHECKING:
    from ._engine import Engine


async def get_event(engine: Engine, run_id: str, key: str, timeout: float | None) -> Any:
    """``Engine.get_event``: the value of the run's newest ``event_set`` of ``key`` (as
    stored: JSON). None set yet: wait up to ``timeout`` real seconds (``None``: until one is
    set or the run settles) for the first, then ``None``; a settled run that never set it
    answers ``None`` at once. ``RunNotFoundError`` for an unknown run."""
    limits.check_identifier("event key", key, limits.MAX_EVENT_NAME_LENGTH)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0
    ):
        raise InvalidInputError(None, f"get_event timeout= takes seconds >= 0, got {timeout!r}")
    await engine._get(run_id)  # (RunNotFoundError before any wait)

    async def pick(run: Run) -> tuple[Any] | None:
        ev = await latest_event(engine.store, run_id, "event_set", "key", key)
        if isinstance(ev, EventSet):
            return (ev.value,)
        if run.status.terminal or timeout == 0:
            return (None,)
        return None

    try:
        # (``timeout=0``: one read, ``pick`` answers at once)
        async with asyncio.timeout(timeout or None):
            (value,) = await wait_for_history(engine.store, engine.bus, run_id, pick)
    except TimeoutError:
        return None
    return value


async def publish_event(engine: Engine, name: str, payload: Any, event_id: str | None) -> Any:
    """``Engine.publish_event``."""
    raise NotImplementedError("engine.publish_event (issue #22)")


__all__ = ["get_event", "publish_event"]
