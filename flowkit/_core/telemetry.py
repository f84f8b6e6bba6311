"""The engine's telemetry hooks (``flowkit.otel`` implements them): what the worker tells an
observer of a run's life — a run started, an activation begun and ended, each step attempt
that really runs (never one replayed from the history), a singleton admission and its wait, a
lost lease.

Zero cost when nobody observes: the engine holds ``None`` (``WorkerConfig.telemetry``) and
tests it before each call. Nothing an observer does changes what is recorded or replayed: the
engine holds it ``guarded`` (an observer that raises is logged and ignored, never a step's or
a run's failure), and the only value that flows back into a run is the trace context
``start_context`` returns, stored as reserved tags of ``run_started`` (``TRACE_TAG_PREFIX``:
a history any flowkit version reads; never matched on replay)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .run import RESERVED_TAG_PREFIX, Run

if TYPE_CHECKING:
    from ..events import RunStarted

__all__ = [
    "FINAL",
    "TRACE_TAG_PREFIX",
    "ActivationObserver",
    "StepObserver",
    "Telemetry",
    "admission_wait",
    "begin",
    "carried",
    "guarded",
    "handed",
    "observed",
    "onward_tags",
    "outcome_status",
    "trace_of",
]


class StepObserver(Protocol):
    """One attempt of a step, from just before its function runs to its outcome."""

    def end(self, error: BaseException | None) -> None:
        """The attempt ended: returned (``None``) or raised ``error``."""
        ...


class ActivationObserver(Protocol):
    """One activation of a run: its body run over the history, then its outcome committed."""

    def step(self, name: str, attempt: int) -> StepObserver:
        """Attempt ``attempt`` of step ``name`` starts running now (its ``end`` is called in
        the same task)."""
        ...

    def end(self, status: str, error: Any = None) -> None:
        """The activation ended with ``status`` (an ``outcome_status``; ``"lost"``: its lease
        was lost or the store failed) and ``error`` (an ``ErrorInfo`` of a failed run, an
        exception, or ``None``)."""
        ...

    def context(self) -> dict[str, str] | None:
        """The trace context of this activation as a carrier, for the runs it starts (its
        children, its continue-as-new successor): their activations continue its trace."""
        ...


class Telemetry(Protocol):
    """The observer an engine reports to (``flowkit.otel`` builds one)."""

    def start_context(self, workflow: str, run_id: str) -> dict[str, str] | None:
        """The trace context to store with a new run ``run_id`` of ``workflow`` as a carrier (W3C
        ``traceparent``…): every activation of the run continues it. ``None``: nothing."""
        ...

    def run_started(self, workflow: str, run_id: str, created: bool) -> None:
        """``engine.start`` of run ``run_id`` (after ``start_context``) ended: ``created``, or
        the run existed already (an idempotent re-start: nothing to report)."""
        ...

    def activation(
        self, run_id: str, workflow: str, attempt: int, trace: dict[str, str] | None
    ) -> ActivationObserver:
        """An activation of the run starts its body (``trace``: the context stored with it)."""
        ...

    def settled(self, workflow: str, status: str) -> None:
        """A run of ``workflow`` reached a final status (or continued as new)."""
        ...

    def admitted(self, workflow: str, key: str, waited: float) -> None:
        """A singleton run of ``workflow`` won a slot of ``key`` after ``waited`` seconds
        (from its creation)."""
        ...

    def lease_lost(self, workflow: str | None) -> None:
        """An activation lost its lease (another instance took the run over)."""
        ...


# the outcome class names of ``flowkit._replay.outcome`` → the status a telemetry reports
_STATUS = {
    "Completed": "completed",
    "Failed": "failed",
    "Cancelled": "cancelled",
    "Suspended": "suspended",
    "Diverged": "blocked",
    "Evicted": "evicted",
    "Continued": "continued",
}
FINAL = frozenset({"completed", "failed", "cancelled", "continued"})
"""The statuses that settle a run (``Telemetry.settled``)."""


def outcome_status(outcome: object) -> str:
    """The status an activation's outcome (``_replay.outcome``) reports."""
    return _STATUS.get(type(outcome).__name__, type(outcome).__name__.lower())


TRACE_TAG_PREFIX = RESERVED_TAG_PREFIX + "trace:"
"""The reserved tags of ``run_started`` that carry its trace context, one per carrier entry:
``flowkit:trace:traceparent=00-…``. Tags, not a field of their own, so a flowkit that
predates tracing (a worker of the previous version during a rolling upgrade) still reads the
history; ``run_tags`` keeps users from writing reserved tags."""


def trace_tags(carrier: dict[str, str]) -> list[str]:
    """The tags that store ``carrier`` (``TRACE_TAG_PREFIX``)."""
    return [f"{TRACE_TAG_PREFIX}{k}={v}" for k, v in carrier.items() if k and "=" not in k]


def trace_of(events: Any) -> dict[str, str] | None:
    """The trace context stored on a history's ``run_started`` (its first event), if any."""
    first = events[0] if events else None
    tags = getattr(first, "tags", None) or ()
    carrier = dict(
        t[len(TRACE_TAG_PREFIX) :].split("=", 1)
        for t in tags
        if t.startswith(TRACE_TAG_PREFIX) and "=" in t
    )
    return carrier or None


def admission_wait(created_at: float, events: Any) -> float | None:
    """For a singleton run admitted in this activation (an unwritten ``singleton_admitted``,
    ``seq`` 0, among ``events``): how long it waited since it was created."""
    for ev in events:
        if getattr(ev, "type", None) == "singleton_admitted" and ev.seq == 0:
            return max(0.0, float(ev.at) - created_at)
    return None


def begin(
    tel: Telemetry, run: Run, events: Sequence[Any], admission: Sequence[Any]
) -> ActivationObserver:
    """An observed activation of ``run`` starts (its singleton admission reported first:
    ``admission``, the records of the gate this activation passed, or an admission decided
    with the run's creation, in ``events``; a run handed over is reported by ``handed``)."""
    if run.singleton_key is not None:
        waited = admission_wait(run.created_at, [*admission, *events])
        if waited is not None:
            tel.admitted(run.workflow, run.singleton_key, waited)
    return tel.activation(run.id, run.workflow, run.attempt, trace_of(events))


async def observed(
    tel: Telemetry, obs: ActivationObserver, workflow: str, body: Awaitable[tuple[object, Any]]
) -> None:
    """Run an activation's ``body`` (it answers its outcome and error) and report its end."""
    try:
        outcome, error = await body
    except BaseException as exc:
        obs.end("lost", exc)
        raise
    status = outcome_status(outcome)
    obs.end(status, error)
    if status in FINAL:
        tel.settled(workflow, status)


def carried(tel: Telemetry, first: RunStarted, run_id: str) -> RunStarted:
    """A new run's ``run_started`` with the caller's trace context (``start_context``) in
    its tags (``TRACE_TAG_PREFIX``)."""
    trace = tel.start_context(first.workflow, run_id)
    if not trace:
        return first
    return first.model_copy(update={"tags": [*first.tags, *trace_tags(trace)]})


def onward_tags(obs: ActivationObserver | None, events: Sequence[Any]) -> list[str]:
    """The trace tags of a run an activation starts (a child, a continue-as-new successor),
    for its ``run_started``: the context of the activation's span when it is observed, else
    the one its own run carries (``events``: its history), so the new run stays in the
    trace either way. ``[]``: none."""
    trace = obs.context() if obs is not None else None
    if not trace:
        trace = trace_of(events)
    return trace_tags(trace) if trace else []


def handed(tel: Telemetry, runs: Sequence[Run], now: float) -> None:
    """A release handed its slots to ``runs`` (admitted in its commit, at ``now``)."""
    for r in runs:
        if r.singleton_key is not None:
            tel.admitted(r.workflow, r.singleton_key, max(0.0, now - r.created_at))


log = logging.getLogger("flowkit")


class _Noop:
    """What a hook that failed hands back: an observer that observes nothing."""

    def step(self, name: str, attempt: int) -> StepObserver:
        return self

    def end(self, *args: Any) -> None:
        return None

    def context(self) -> dict[str, str] | None:
        return None


_NOOP = _Noop()


class _Guard:
    """Calls an observer's hooks, logging and swallowing what they raise (``Exception``:
    never a cancellation): a tracing SDK or exporter that fails must not fail a step, a run or
    a start. Each hook's first failure is logged with its traceback, later ones not."""

    __slots__ = ("_failed", "inner")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._failed: set[str] = set()

    def call(self, hook: str, fn: Any, *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except Exception:
            if hook not in self._failed:
                self._failed.add(hook)
                log.warning("telemetry hook %s failed (ignored)", hook, exc_info=True)
            return default


class _GuardedStep:
    __slots__ = ("_g", "_inner")

    def __init__(self, g: _Guard, inner: StepObserver) -> None:
        self._g, self._inner = g, inner

    def end(self, error: BaseException | None) -> None:
        self._g.call("step.end", self._inner.end, error)


class _GuardedActivation:
    __slots__ = ("_g", "_inner")

    def __init__(self, g: _Guard, inner: ActivationObserver) -> None:
        self._g, self._inner = g, inner

    def step(self, name: str, attempt: int) -> StepObserver:
        obs = self._g.call("step", self._inner.step, name, attempt, default=_NOOP)
        return obs if obs is _NOOP else _GuardedStep(self._g, obs)

    def end(self, status: str, error: Any = None) -> None:
        self._g.call("activation.end", self._inner.end, status, error)

    def context(self) -> dict[str, str] | None:
        found = self._g.call("activation.context", self._inner.context)
        return found if isinstance(found, dict) else None


class Guarded:
    """``inner`` (a ``Telemetry``) with every hook guarded (``_Guard``): what the engine holds
    (``guarded``)."""

    __slots__ = ("_g",)

    def __init__(self, inner: Telemetry) -> None:
        self._g = _Guard(inner)

    @property
    def inner(self) -> Telemetry:
        inner: Telemetry = self._g.inner
        return inner

    def start_context(self, workflow: str, run_id: str) -> dict[str, str] | None:
        found = self._g.call("start_context", self.inner.start_context, workflow, run_id)
        return found if isinstance(found, dict) else None

    def run_started(self, workflow: str, run_id: str, created: bool) -> None:
        self._g.call("run_started", self.inner.run_started, workflow, run_id, created)

    def activation(
        self, run_id: str, workflow: str, attempt: int, trace: dict[str, str] | None
    ) -> ActivationObserver:
        obs = self._g.call(
            "activation", self.inner.activation, run_id, workflow, attempt, trace, default=_NOOP
        )
        return obs if obs is _NOOP else _GuardedActivation(self._g, obs)

    def settled(self, workflow: str, status: str) -> None:
        self._g.call("settled", self.inner.settled, workflow, status)

    def admitted(self, workflow: str, key: str, waited: float) -> None:
        self._g.call("admitted", self.inner.admitted, workflow, key, waited)

    def lease_lost(self, workflow: str | None) -> None:
        self._g.call("lease_lost", self.inner.lease_lost, workflow)


def guarded(tel: Telemetry) -> Guarded:
    """``tel`` as the engine holds it: a failing hook is logged and ignored (``Guarded``)."""
    return tel if isinstance(tel, Guarded) else Guarded(tel)
