"""``ctx.wait_for_update`` (event ``update_received``) and ``UpdateRequest.reply``
(``update_replied``): DESIGN §11."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from .state import ActivationState


def wait_for_update(
    st: ActivationState, runtime: Any, name: str, timeout: float | None
) -> Coroutine[Any, Any, Any]:
    """``ctx.wait_for_update``: takes its position now; an ``UpdateRequest``."""
    raise NotImplementedError("ctx.wait_for_update (issue #22)")


def reply_update(st: ActivationState, upd: Any, value: Any) -> Coroutine[Any, Any, None]:
    """``UpdateRequest.reply``: takes its position now; records ``UpdateReplied``."""
    raise NotImplementedError("UpdateRequest.reply (issue #22)")
