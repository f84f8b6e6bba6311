"""``ctx.upsert_search``: search attributes (event ``search_upserted``), DESIGN §11."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from .state import ActivationState


def upsert_search(st: ActivationState, attrs: dict[str, Any]) -> Awaitable[None]:
    """``ctx.upsert_search``: takes its position now; records ``SearchUpserted``."""
    raise NotImplementedError("ctx.upsert_search (issue #22)")
