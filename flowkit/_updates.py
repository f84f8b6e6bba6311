"""Updates (DESIGN §11): ``@update_validator`` and ``Engine.update``, request/response with a
running run, and the typed payloads of signals and updates (``@workflow(signals=...,
updates=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._engine import Engine

F = TypeVar("F", bound=Callable[..., Any])

VALIDATOR_ATTR = "__flowkit_update_validator__"
"""The attribute ``update_validator`` sets on a method: the update name it validates."""


def update_validator(name: str) -> Callable[[F], F]:
    """Mark a workflow method ``def check(self, arg) -> None`` as the validator of update
    ``name``: ``engine.update`` calls it before writing anything, and an exception it raises
    rejects the update (``UpdateRejectedError`` at the caller, nothing written)."""
    if not isinstance(name, str) or not name:
        raise ValueError("update_validator takes a non-empty update name")

    def mark(fn: F) -> F:
        setattr(fn, VALIDATOR_ATTR, name)
        return fn

    return mark


async def update(engine: Engine, run_id: str, name: str, arg: Any, timeout: float | None) -> Any:
    """``Engine.update``."""
    raise NotImplementedError("engine.update (issue #22)")


__all__ = ["VALIDATOR_ATTR", "update", "update_validator"]
