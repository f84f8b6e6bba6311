"""The engine's telemetry hooks (``flowkit.otel`` implements them): what the worker tells an
observer of a run's life — a run started, an activation begun and ended, each step attempt
that really runs (never one replayed from the history), a singleton admission and its wait, a
lost lease.

Zero cost when nobody observes: the engine holds ``None`` (``WorkerConfig.telemetry``) and
tests it before each call. Nothing an observer does changes what is recorded or replayed: the
only value that flows back into a run is the trace context ``start_context`` returns, stored
as metadata on ``run_started`` (never matched on replay)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._run import Run

if TYPE_CHECKING:
    from .events import RunStarted

__all__ = [
    "FINAL",
    "ActivationObserver",
    "StepObserver",
    "Telemetry",
    "admission_wait",
    "begin",
    "carried",
    "handed",
    "observed",
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


class Telemetry(Protocol):
    """The observer an engine reports to (``flowkit.otel`` builds one)."""

    def start_context(self, workflow: str, run_id: str) -> dict[str, str] | None:
        """The trace context to store with a new run ``run_id`` of ``workflow`` as a carrier (W3C
        ``traceparent``…): every activation of the run continues it. ``None``: nothing."""
        ...

    def run_started(self, workflow: str) -> None:
        """A new run of ``workflow`` was created."""
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


def trace_of(events: Any) -> dict[str, str] | None:
    """The trace context stored on a history's ``run_started`` (its first event), if any."""
    first = events[0] if events else None
    return getattr(first, "trace", None) if first is not None else None


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
    """A new run's ``run_started`` with the caller's trace context (``start_context``)."""
    trace = tel.start_context(first.workflow, run_id)
    return first if not trace else first.model_copy(update={"trace": trace})


def handed(tel: Telemetry, runs: Sequence[Run], now: float) -> None:
    """A release handed its slots to ``runs`` (admitted in its commit, at ``now``)."""
    for r in runs:
        if r.singleton_key is not None:
            tel.admitted(r.workflow, r.singleton_key, max(0.0, now - r.created_at))
