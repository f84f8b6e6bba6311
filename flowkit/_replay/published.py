"""``ctx.set_event`` (a published value, event ``event_set``) and ``ctx.wait_for_event`` (a
published event, ``event_received``): DESIGN §11."""

from __future__ import annotations

from collections.abc import Awaitable, Coroutine
from typing import Any

from .state import ActivationState


def set_event(st: ActivationState, key: str, value: Any) -> Awaitable[None]:
    """``ctx.set_event``: takes its position now; records ``EventSet``."""
    raise NotImplementedError("ctx.set_event (issue #22)")


def wait_for_event(
    st: ActivationState, name: str, match: dict[str, Any] | None, timeout: float | None
) -> Coroutine[Any, Any, Any]:
    """``ctx.wait_for_event``: takes its position now; records ``EventReceived``."""
    raise NotImplementedError("ctx.wait_for_event (issue #22)")
