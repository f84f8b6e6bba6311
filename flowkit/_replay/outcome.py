"""How an activation ends, as ``Activation.run`` reports it to its driver (``_worker/runner.py``,
``replay``), and ``error_info``: an exception as the history stores it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._core import limits as _limits
from ..errors import NonDeterminismError, StepFailedError
from ..events import ErrorInfo


@dataclass(frozen=True)
class Completed:
    """The body returned ``output`` (its JSON form)."""

    output: Any


@dataclass(frozen=True)
class Continued:
    """The body called ``ctx.continue_as_new(input)`` (``input``: its stored JSON, validated
    as ``Engine.start`` validates a new run's)."""

    input: Any


@dataclass(frozen=True)
class Failed:
    """The body raised ``error``."""

    error: ErrorInfo


@dataclass(frozen=True)
class Cancelled:
    """The body let the run's cancellation propagate."""


@dataclass(frozen=True)
class Suspended:
    """Every branch waits durably: resume at ``wake_at`` or when one of ``signals`` arrives.
    ``compensating``: the wait is a compensation's retry backoff (the run stays
    ``cancelling``, due at ``wake_at``). ``firm_wake_at``: the earliest deadline of a wait
    that is not only a fallback look (``Park.poll``); below ``wake_at`` never, above it when
    ``wake_at`` is only such a look (``None``: nothing durable is due at any time)."""

    wake_at: float | None
    signals: tuple[str, ...]
    compensating: bool = False
    firm_wake_at: float | None = None


@dataclass(frozen=True)
class Diverged:
    """The body no longer matches its history (or awaited what cannot be replayed)."""

    error: NonDeterminismError


@dataclass(frozen=True)
class Evicted:
    """The activation stopped without an outcome (lease lost, store failure, engine
    stopping, end of a replay): nothing more is recorded."""


Outcome = Completed | Continued | Failed | Cancelled | Suspended | Diverged | Evicted


def error_info(
    exc: BaseException, step: str | None = None, attempts: int | None = None
) -> ErrorInfo:
    """``exc`` as a history records it (a ``StepFailedError`` with its cause). Its texts are
    made storable (``flowkit._core.limits.error_text``: NUL escaped, cut when very long), so that
    no exception message can make a run unrecordable."""
    text = _limits.error_text
    if isinstance(exc, StepFailedError):
        return ErrorInfo(
            type="StepFailedError",
            message=text(str(exc)),
            step=text(exc.step),
            attempts=exc.attempts,
            cause_type=text(exc.error_type),
            cause_message=text(exc.message),
        )
    return ErrorInfo(
        type=text(type(exc).__name__),
        message=text(str(exc)),
        step=None if step is None else text(step),
        attempts=attempts,
    )
