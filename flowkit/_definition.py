"""Workflow declaration: ``@workflow``, ``Singleton``, ``RetryPolicy``. No engine imports here."""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import TypeAdapter

_DEF_ATTR = "__flowkit_workflow__"
T = TypeVar("T", bound=type)


@dataclass(frozen=True)
class Singleton:
    """A durable FIFO mutex over runs whose ``key(input)`` is equal.

    ``limit`` runs sharing a key may hold a slot at once; ``max_queue_depth`` caps how many more
    may wait (``None``: unbounded). Bad values raise ``ValueError`` here, at decoration time."""

    key: Callable[[Any], str]
    limit: int = 1
    max_queue_depth: int | None = None

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise ValueError("Singleton.key must be a callable input -> str")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"Singleton.limit must be an int >= 1, got {self.limit!r}")
        mqd = self.max_queue_depth
        if mqd is not None and (isinstance(mqd, bool) or not isinstance(mqd, int) or mqd < 0):
            raise ValueError(f"Singleton.max_queue_depth must be an int >= 0 or None, got {mqd!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """How ``ctx.step`` retries a failing function, with durable backoff between attempts.

    Attempt ``n`` (n >= 2) waits ``min(initial_interval * backoff**(n-2), max_interval)``."""

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 100.0
    non_retryable: tuple[type[BaseException], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be >= 1")
        if self.initial_interval < 0 or self.max_interval < 0:
            raise ValueError("RetryPolicy intervals must be >= 0")
        if self.backoff < 1 or not math.isfinite(self.backoff):
            raise ValueError("RetryPolicy.backoff must be a finite number >= 1")

    def delay_before(self, attempt: int) -> float:
        """The backoff to wait before ``attempt`` (2, 3, ...)."""
        raw = self.initial_interval * self.backoff ** max(attempt - 2, 0)
        return float(min(raw, self.max_interval))

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure of ``attempt`` with ``exc`` gets another attempt."""
        return attempt < self.max_attempts and not isinstance(exc, self.non_retryable)


@dataclass(frozen=True)
class WorkflowDefinition:
    """What ``@workflow`` learned about a class: name, version, input/output adapters."""

    cls: type
    name: str
    version: str
    singleton: Singleton | None
    input_type: Any
    output_type: Any
    input_adapter: TypeAdapter[Any]
    output_adapter: TypeAdapter[Any]


def _run_types(cls: type) -> tuple[Any, Any]:
    run = getattr(cls, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise TypeError(f"{cls.__qualname__} must define `async def run(self, ctx, input)`")
    params = list(inspect.signature(run).parameters.values())
    if len(params) != 3:
        raise TypeError(
            f"{cls.__qualname__}.run must take exactly (self, ctx, input), got {len(params)} "
            "parameters"
        )
    try:
        hints = typing.get_type_hints(run)
    except Exception:  # unresolved forward references: fall back to Any
        hints = {}
    return hints.get(params[2].name, Any), hints.get("return", Any)


def workflow(
    cls: T | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    singleton: Singleton | None = None,
) -> Any:
    """Declare a workflow class: ``@workflow(name=..., version=..., singleton=...)``."""

    def wrap(klass: T) -> T:
        if not isinstance(klass, type):
            raise TypeError("@workflow decorates a class")
        if singleton is not None and not isinstance(singleton, Singleton):
            raise ValueError("singleton= takes a flowkit.Singleton(...)")
        in_t, out_t = _run_types(klass)
        defn = WorkflowDefinition(
            cls=klass,
            name=name or klass.__name__,
            version=str(version),
            singleton=singleton,
            input_type=in_t,
            output_type=out_t,
            input_adapter=TypeAdapter(in_t),
            output_adapter=TypeAdapter(out_t),
        )
        setattr(klass, _DEF_ATTR, defn)
        return klass

    if cls is not None:
        return wrap(cls)
    return wrap


def definition_of(obj: Any) -> WorkflowDefinition | None:
    """The definition of a decorated class or instance, else ``None``."""
    klass = obj if isinstance(obj, type) else type(obj)
    defn = getattr(klass, _DEF_ATTR, None)
    if isinstance(defn, WorkflowDefinition) and defn.cls is klass:
        return defn
    return None
