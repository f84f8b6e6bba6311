"""Retention (DESIGN §11): ``Engine.prune`` deletes terminal runs settled long enough ago, with
everything that belongs to them, in short batches; ``Engine(retention=...)`` has the worker do
it periodically."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._run import RunStatus

if TYPE_CHECKING:
    from ._engine import Engine


async def prune(
    engine: Engine,
    older_than: float,
    workflow: str | None,
    status: RunStatus | None,
) -> int:
    """``Engine.prune``."""
    raise NotImplementedError("engine.prune (issue #22)")


__all__ = ["prune"]
