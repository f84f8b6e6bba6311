"""The pieces an activation is made of: control-flow signals, outcomes, branches, helpers."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._history import (
    ErrorInfo,
    Event,
)
from .errors import (
    NonDeterminismError,
    StepFailedError,
)
from .stores.base import InboxSignal


class _ControlFlow(BaseException):
    """Base of internal control-flow signals; a user's ``except Exception`` cannot swallow them."""


class _Evicted(_ControlFlow):
    """The activation is being torn down (suspension, lease lost, replay end)."""


class _Diverged(_ControlFlow):
    """The body diverged from its history; carries the ``NonDeterminismError``."""


class ReplayStub:
    """Stands in for services a workflow got through its constructor when ``replay`` is
    given a class it cannot construct: replay never calls steps, so any attribute path will
    do, and such steps are matched by position and kind only."""

    ANY_NAME = "<replay-stub>"

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> ReplayStub:
        if name.startswith("__"):
            raise AttributeError(name)
        return ReplayStub(f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"replay never executes steps ({self._path} was called)")


class Host(Protocol):
    """What an activation needs from the engine: time, durable appends, the signal inbox."""

    def now(self) -> float: ...

    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> bool:
        """Append events under the lease; returns whether cancellation was requested."""
        ...

    async def peek_signal(self, name: str) -> InboxSignal | None: ...


# -- outcomes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Completed:
    output: Any


@dataclass(frozen=True)
class Failed:
    error: ErrorInfo


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class Suspended:
    wake_at: float | None
    signals: tuple[str, ...]


@dataclass(frozen=True)
class Diverged:
    error: NonDeterminismError


@dataclass(frozen=True)
class Evicted:
    pass


Outcome = Completed | Failed | Cancelled | Suspended | Diverged | Evicted


@dataclass
class _Branch:
    prefix: str
    now_at: float
    seed: int
    counter: int = 0
    _rng: random.Random | None = None

    @property
    def rng(self) -> random.Random:
        """The branch's deterministic RNG, seeded on first use (most bodies never draw)."""
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def next_pos(self) -> str:
        self.counter += 1
        return f"{self.prefix}{self.counter}"


@dataclass
class _Park:
    deadline: float | None
    signal: str | None
    fut: asyncio.Future[None]


@dataclass
class _Group:
    remaining: int
    parent_unblocked: bool = False


_BRANCH: contextvars.ContextVar[tuple[Any, _Branch] | None] = contextvars.ContextVar(
    "flowkit_branch", default=None
)


def _seed(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big")


def _describe(ev: Event) -> str:
    name = getattr(ev, "name", None)
    text = f"{ev.type}#{ev.seq}"
    if name:
        digest = getattr(ev, "args_digest", None)
        text += f"({name!r}" + (f", args {digest}" if digest else "") + ")"
    pos = getattr(ev, "pos", None)
    return text + (f" at position {pos}" if pos is not None else "")


def error_info(
    exc: BaseException, step: str | None = None, attempts: int | None = None
) -> ErrorInfo:
    if isinstance(exc, StepFailedError):
        return ErrorInfo(
            type="StepFailedError",
            message=str(exc),
            step=exc.step,
            attempts=exc.attempts,
            cause_type=exc.error_type,
            cause_message=exc.message,
        )
    return ErrorInfo(type=type(exc).__name__, message=str(exc), step=step, attempts=attempts)


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _silence(task: asyncio.Task[Any]) -> None:
    if task.done() and not task.cancelled():
        task.exception()
