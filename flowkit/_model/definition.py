"""Workflow declaration: ``@workflow``, ``Singleton``, ``RetryPolicy``. No engine imports here."""

from __future__ import annotations

import inspect
import math
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any, TypeVar

from pydantic import TypeAdapter

from .._core import annotations as _annotations
from .._core import limits as _limits

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

    Attempt ``n`` (n >= 2) waits ``min(initial_interval * backoff**(n-2), max_interval)``.
    The intervals are seconds or ``datetime.timedelta``s (kept as seconds), each within the
    limits of every duration (``InvalidInputError``, a ``ValueError``, otherwise)."""

    max_attempts: int = 3
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 100.0
    non_retryable: tuple[type[BaseException], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be >= 1")
        for name in ("initial_interval", "max_interval"):
            seconds = _limits.duration(f"RetryPolicy.{name}", getattr(self, name))
            object.__setattr__(self, name, seconds)  # (a timedelta kept as seconds)
        if self.backoff < 1 or not math.isfinite(self.backoff):
            raise ValueError("RetryPolicy.backoff must be a finite number >= 1")

    def delay_before(self, attempt: int) -> float:
        """The backoff to wait before ``attempt`` (2, 3, ...)."""
        try:
            raw = self.initial_interval * self.backoff ** max(attempt - 2, 0)
        except OverflowError:  # (a late attempt of a long policy: past any interval)
            raw = math.inf
        return float(min(raw, self.max_interval))

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure of ``attempt`` with ``exc`` gets another attempt."""
        return attempt < self.max_attempts and not isinstance(exc, self.non_retryable)


# Where ``@workflow`` was applied: a module (or class body) still being executed, whose later
# lines may define a name ``run`` annotates with, or a function, whose names are all known.
_FUNCTION_FRAME = inspect.CO_OPTIMIZED


@dataclass(frozen=True)
class _RunAnnotations:
    """What resolving ``run``'s input and output annotations needs: the function, the class
    that defines it, and the local names of the scope ``@workflow`` was applied in (a copy,
    taken then: a class defined in a test function may annotate with the test's local
    models)."""

    cls: type
    run: Callable[..., Any]
    owner: type
    param: str
    localns: dict[str, Any]

    def resolve(self, name: str) -> tuple[Any, Any]:
        """``(input_type, output_type)``: unannotated means ``Any``. Raises ``TypeError``
        naming the workflow, the annotation and the missing name when one cannot be
        resolved (``NameError`` as its ``__cause__``)."""
        anns = inspect.get_annotations(self.run)
        globalns = _annotations.function_globals(self.run)
        localns = {**self.localns, **_annotations.class_names(self.owner)}
        out: list[Any] = []
        for key, what in ((self.param, f"parameter {self.param!r}"), ("return", "return")):
            ann = anns.get(key, _annotations.MISSING)
            if ann is _annotations.MISSING:
                out.append(Any)
                continue
            try:
                out.append(_annotations.evaluate(ann, globalns, localns))
            except Exception as exc:
                raise TypeError(self._explain(name, what, ann, exc)) from exc
        return out[0], out[1]

    def _explain(self, name: str, what: str, ann: Any, exc: Exception) -> str:
        text = (
            f"@workflow {self.cls.__qualname__} (workflow {name!r}): cannot resolve the "
            f"annotation {_annotations.describe(ann)!r} of run()'s {what}: "
            f"{type(exc).__name__}: {exc}."
        )
        missing = _annotations.missing_name(exc)
        if missing is not None:
            text += (
                f" Define or import {missing!r} in module {self.run.__module__!r} (an import "
                "under `if TYPE_CHECKING:` is not there at run time), in the class body, or "
                "before the class in the function that applies @workflow; or leave the "
                "annotation out to accept any JSON value."
            )
        return text


DEFAULT_MAX_RECOVERY_ATTEMPTS = 10
"""How many lost activations (a worker that died while running the run) a run survives by
default before it settles ``dead``. Finite on purpose: a *poison* run (one whose body kills
its worker: a segfaulting extension, an out-of-memory step) would otherwise be recovered for
ever, taking every other run of each worker it lands on down with it. A graceful stop gives
its leases back and never counts, so ten real deaths of one run is a strong sign of poison;
``engine.retry`` revives a dead run once the cause is fixed (docs/writing-workflows.md,
"Dead letters")."""


def _check_timeout(value: Any) -> float | None:
    """``execution_timeout``: seconds > 0 or a ``timedelta`` (``None`` or ``math.inf``:
    none); ``InvalidInputError`` (a ``ValueError``) otherwise."""
    return _limits.timeout("execution_timeout", value, positive=True)


def _check_recoveries(value: Any) -> int | None:
    """``max_recovery_attempts``: an int >= 0, or ``None`` (unbounded); ``ValueError`` else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"max_recovery_attempts must be an int >= 0 or None, got {value!r}")
    return value


_LAZY = frozenset({"input_type", "output_type", "input_adapter", "output_adapter"})


@dataclass(frozen=True, eq=False)
class WorkflowDefinition:
    """What ``@workflow`` learned about a class: name, version, input/output adapters.

    The input and output types are resolved at decoration. Only a name that a later line of
    the module may still define (a model declared below the workflow class) waits: it is
    resolved when the definition is first used (``Engine`` registration, ``start``,
    ``replay``), and one that is still missing then raises ``TypeError``."""

    cls: type
    name: str
    version: str
    singleton: Singleton | None
    annotations: _RunAnnotations = field(repr=False)
    # seconds after its start at which a run still active is cancelled (``None``: never)
    execution_timeout: float | None = None
    # lost activations a run survives before it settles ``dead`` (``None``: unbounded)
    max_recovery_attempts: int | None = DEFAULT_MAX_RECOVERY_ATTEMPTS
    # docs/events.md: the published event that starts one run each (``None``: none), and the
    # payload types of signals and updates by name (validated before anything is written)
    on_event: str | None = None
    signals: dict[str, Any] = field(default_factory=dict)
    updates: dict[str, Any] = field(default_factory=dict)
    input_type: Any = field(init=False, repr=False)
    output_type: Any = field(init=False, repr=False)
    input_adapter: TypeAdapter[Any] = field(init=False, repr=False)
    output_adapter: TypeAdapter[Any] = field(init=False, repr=False)

    @property
    def resolved(self) -> bool:
        """Whether the input and output types are resolved yet."""
        return "output_adapter" in self.__dict__

    def resolve(self) -> None:
        """Resolve the input and output types now (a no-op once done); ``TypeError`` naming
        the annotation and the missing name when one cannot be."""
        if self.resolved:
            return
        in_t, out_t = self.annotations.resolve(self.name)
        out_t = _annotations.result_type(out_t)  # (``-> NoReturn``: a body that never returns)
        in_ad, out_ad = TypeAdapter(in_t), TypeAdapter(out_t)
        object.__setattr__(self, "input_type", in_t)
        object.__setattr__(self, "output_type", out_t)
        object.__setattr__(self, "input_adapter", in_ad)
        object.__setattr__(self, "output_adapter", out_ad)

    if not typing.TYPE_CHECKING:  # (type checkers see the declared fields)

        def __getattr__(self, attr: str) -> Any:
            # only called for a type field that is not resolved yet
            if attr in _LAZY:
                self.resolve()
                return self.__dict__[attr]
            raise AttributeError(f"{type(self).__qualname__!r} object has no attribute {attr!r}")


def _scope(cls: type) -> str:
    return cls.__qualname__.rpartition(".")[0]


def _run_annotations(cls: type, frame: FrameType | None) -> _RunAnnotations:
    run = getattr(cls, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise TypeError(f"{cls.__qualname__} must define `async def run(self, ctx, input)`")
    params = list(inspect.signature(run).parameters.values())
    if len(params) != 3:
        raise TypeError(
            f"{cls.__qualname__}.run must take exactly (self, ctx, input), got {len(params)} "
            "parameters"
        )
    owner = next((k for k in cls.__mro__ if "run" in vars(k)), cls)
    # the local names of the scope that defined ``run``: the decorating frame's when the class
    # (or the base it inherits ``run`` from) was declared there, else a decorated base's
    same_scope = owner.__module__ == cls.__module__ and _scope(owner) == _scope(cls)
    localns: dict[str, Any] = {}
    base = vars(owner).get(_DEF_ATTR)
    if same_scope and frame is not None and frame.f_locals is not frame.f_globals:
        localns = dict(frame.f_locals)
    elif not same_scope and isinstance(base, WorkflowDefinition):
        localns = base.annotations.localns
    return _RunAnnotations(cls, run, owner, params[2].name, localns)


def _declare(
    klass: Any,
    name: str | None,
    version: str,
    singleton: Any,
    frame: FrameType | None,
    execution_timeout: Any = None,
    max_recovery_attempts: Any = DEFAULT_MAX_RECOVERY_ATTEMPTS,
    on_event: Any = None,
    signals: Any = None,
    updates: Any = None,
) -> Any:
    if not isinstance(klass, type):
        raise TypeError("@workflow decorates a class")
    if singleton is not None and not isinstance(singleton, Singleton):
        raise ValueError("singleton= takes a flowkit.Singleton(...)")
    timeout = _check_timeout(execution_timeout)
    recoveries = _check_recoveries(max_recovery_attempts)
    for what, value in (("name", name or klass.__name__), ("version", str(version))):
        problem = _limits.identifier_problem(value, _limits.MAX_WORKFLOW_NAME_LENGTH)
        if problem is not None:  # (no store could keep its runs)
            raise ValueError(f"@workflow {what} {problem}")
    for what, names in (("signals", signals), ("updates", updates)):
        reserved = [n for n in names or () if isinstance(n, str) and n.startswith("flowkit:")]
        if reserved:  # (such names are refused from every caller: docs/updates.md)
            raise ValueError(f"@workflow {what}= name {reserved[0]!r}: 'flowkit:' is reserved")
    defn = WorkflowDefinition(
        cls=klass,
        name=name or klass.__name__,
        version=str(version),
        singleton=singleton,
        annotations=_run_annotations(klass, frame),
        execution_timeout=timeout,
        max_recovery_attempts=recoveries,
        on_event=on_event,
        signals=dict(signals or {}),
        updates=dict(updates or {}),
    )
    try:
        defn.resolve()
    except TypeError as exc:
        # A name missing from a module (or class body) still being executed may be defined
        # by a later line: wait for first use. In a function every name is known by now.
        in_function = frame is not None and bool(frame.f_code.co_flags & _FUNCTION_FRAME)
        if in_function or not isinstance(exc.__cause__, NameError):
            raise
    setattr(klass, _DEF_ATTR, defn)
    return klass


def workflow(
    cls: T | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    singleton: Singleton | None = None,
    execution_timeout: float | timedelta | None = None,
    max_recovery_attempts: int | None = DEFAULT_MAX_RECOVERY_ATTEMPTS,
    on_event: str | None = None,
    signals: Mapping[str, Any] | None = None,
    updates: Mapping[str, Any] | None = None,
) -> Any:
    """Declare a workflow class: ``@workflow(name=..., version=..., singleton=...)``.

    ``execution_timeout`` (seconds or a ``timedelta``): a run still active that long after
    its start is cancelled. ``max_recovery_attempts``: a run whose activation was lost (its
    worker died) more often settles ``dead`` (``None``: never). Bad values raise
    ``ValueError`` here.

    ``run``'s input and return annotations are resolved with the module's names, the class
    body's and those of the function that applies the decorator; one that cannot be resolved
    raises ``TypeError`` here (or, for a name a later line of the module may define, when
    the workflow is first used).

    docs/events.md: ``on_event`` names a published event that starts one run per event;
    ``signals`` / ``updates`` map a signal's / an update's name to its payload type."""
    limits = (execution_timeout, max_recovery_attempts, on_event, signals, updates)

    def wrap(klass: T) -> T:
        # (sys._getframe is documented CPython API: the caller's frame, cheaper than inspect)
        frame = sys._getframe(1)  # noqa: SLF001
        return typing.cast(T, _declare(klass, name, version, singleton, frame, *limits))

    if cls is not None:
        # (sys._getframe is documented CPython API: the caller's frame, cheaper than inspect)
        frame = sys._getframe(1)  # noqa: SLF001
        return _declare(cls, name, version, singleton, frame, *limits)
    return wrap


def definition_of(obj: Any) -> WorkflowDefinition | None:
    """The definition of a decorated class or instance, else ``None``. Its input and output
    types are resolved: a name still missing raises ``TypeError`` here (at ``Engine``
    registration, not at a run's first activation)."""
    klass = obj if isinstance(obj, type) else type(obj)
    defn = getattr(klass, _DEF_ATTR, None)
    if isinstance(defn, WorkflowDefinition) and defn.cls is klass:
        if not defn.resolved:
            defn.resolve()
        return defn
    return None
