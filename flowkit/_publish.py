"""Published values and events (DESIGN §11): ``Engine.get_event`` (a run's latest
``ctx.set_event`` value) and ``Engine.publish_event`` (fan-out to ``ctx.wait_for_event``
waiters, buffering, ``event_id`` dedupe, and the runs of ``@workflow(on_event=...)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._engine import Engine


async def get_event(engine: Engine, run_id: str, key: str, timeout: float | None) -> Any:
    """``Engine.get_event``."""
    raise NotImplementedError("engine.get_event (issue #22)")


async def publish_event(engine: Engine, name: str, payload: Any, event_id: str | None) -> Any:
    """``Engine.publish_event``."""
    raise NotImplementedError("engine.publish_event (issue #22)")


__all__ = ["get_event", "publish_event"]
