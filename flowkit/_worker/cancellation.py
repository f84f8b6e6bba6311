"""Cancelling a run, shared by ``Engine.cancel`` (a user's request) and the worker (a run's
``execution_timeout`` passing): the request itself, the direct settlement of a run no body can
receive it in, and the run deadline's rules (docs/writing-workflows.md, "Run deadlines").

A run's deadline fires through the timer machinery, never a scan of all runs: every wake time
the engine writes for a parked run is clamped to its deadline (``clamp``), so the run is due
by then and the claim that takes it cancels it (``ActivationRunner``); an activation running as the
deadline passes is cancelled by an in-process timer (``ActivationRunner.timers``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._core.clock import Clock
from .._core.run import Run, RunStatus
from .._core.telemetry import Telemetry
from .._model.registry import Registry
from ..events import CancelRequested, Event
from ..stores.base import ConflictError, Store, Update
from . import children as _children
from . import gate as gate
from .config import Settled

EXECUTION_TIMEOUT = "execution_timeout"
"""``CancelRequested.reason`` of a cancellation by the run's deadline."""


def clamp(wake_at: float | None, deadline_at: float | None) -> float | None:
    """The wake time to write for a parked run: ``wake_at``, but never later than the run's
    deadline (a wait without a wake time, a signal wait, becomes due at the deadline)."""
    if deadline_at is None:
        return wake_at
    return deadline_at if wake_at is None else min(wake_at, deadline_at)


def passed(run: Run, now: float) -> bool:
    """Whether ``run``'s deadline has passed and no cancellation was requested yet."""
    return (
        run.deadline_at is not None
        and now >= run.deadline_at
        and run.status.active
        and run.status is not RunStatus.CANCELLING
    )


def receives(run: Run, events: Sequence[Event]) -> bool:
    """Whether a body can receive a cancellation of ``run`` (claimed by a worker, with its
    history): it got past its gate, its code replays its history (it is not ``blocked``:
    only a blocked run carries an error while active), and it started (a step, a timer or a
    signal was recorded, or it waits for a signal). Otherwise it settles ``cancelled`` at
    once, as ``Engine.cancel`` settles a pending or blocked run."""
    if gate.waiting(run) or run.error is not None:
        return False
    return bool(run.waiting_signals) or any(getattr(e, "pos", None) is not None for e in events)


def limit_of(registry: Registry, run: Run) -> int | None:
    """The singleton limit of ``run``'s workflow as registered here (its own version, else
    the newest; ``None``: unknown)."""
    entry = registry.get(run.workflow, run.workflow_version) or registry.get(run.workflow)
    sg = entry[0].singleton if entry else None
    return sg.limit if sg else None


async def request(
    store: Store,
    clock: Clock,
    registry: Registry,
    run_id: str,
    *,
    reason: str | None,
    compensate: bool = False,
    settled: Settled,
    wake: Callable[[str], None],
    deliver: Callable[[str], bool],
    telemetry: Telemetry | None = None,
) -> Run | None:
    """Request the cancellation of ``run_id`` (``None``: no such run). A settled or
    cancelling run is returned as it is. A run no body can receive it in (it never started,
    never got past its gate, or is blocked) and that nobody holds settles ``cancelled`` at
    once; otherwise it goes ``cancelling`` (event ``cancel_requested`` with ``reason``) and
    ``deliver`` hands the cancellation to an activation of this process (``False``: none
    here, so ``wake`` has a worker claim the run). ``compensate`` (recorded in the request):
    the body's compensations run once it let the cancellation out (``_replay/compensation.py``).
    Its unfinished children (docs/composing-workflows.md) are cancelled with it, recursively
    (``children``), with the same ``compensate``. ``telemetry`` counts the runs settled at once
    here (the others settle in an activation, which counts them)."""
    run = await _request(
        store,
        clock,
        registry,
        run_id,
        reason=reason,
        compensate=compensate,
        settled=settled,
        wake=wake,
        deliver=deliver,
        telemetry=telemetry,
    )
    if run is not None and run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
        await children(
            store,
            clock,
            registry,
            run_id,
            compensate=compensate,
            settled=settled,
            wake=wake,
            deliver=deliver,
            telemetry=telemetry,
        )
    return run


async def children(
    store: Store,
    clock: Clock,
    registry: Registry,
    run_id: str,
    *,
    compensate: bool = False,
    settled: Settled,
    wake: Callable[[str], None],
    deliver: Callable[[str], bool],
    telemetry: Telemetry | None = None,
) -> None:
    """Cancel the unfinished children of ``run_id`` (and theirs, through ``request``)."""

    async def one(child_id: str) -> None:
        await request(
            store,
            clock,
            registry,
            child_id,
            reason=None,
            compensate=compensate,
            settled=settled,
            wake=wake,
            deliver=deliver,
            telemetry=telemetry,
        )

    await _children.cancel_children(store, run_id, one)


async def _request(
    store: Store,
    clock: Clock,
    registry: Registry,
    run_id: str,
    *,
    reason: str | None,
    compensate: bool,
    settled: Settled,
    wake: Callable[[str], None],
    deliver: Callable[[str], bool],
    telemetry: Telemetry | None = None,
) -> Run | None:
    """``request`` for the run itself."""
    while True:
        run = await store.get_run(run_id)
        if run is None or run.status.terminal or run.status is RunStatus.CANCELLING:
            return run
        now = clock.now()
        direct = run.status in (RunStatus.PENDING, RunStatus.BLOCKED) or gate.waiting(run)
        try:
            if direct and not run.leased(now):
                update = gate.cancel_at_once(run, limit_of(registry, run), now, reason)
                res = await store.commit(run_id, None, now, update)
                if telemetry is not None and res.run.status.terminal:
                    telemetry.settled(res.run.workflow, res.run.status.value)
                settled(run_id, res.run)
                for wid in res.woken:
                    wake(wid)
                return res.run
            res = await store.commit(
                run_id,
                None,
                now,
                Update(
                    events=[CancelRequested(at=now, reason=reason, compensate=compensate)],
                    status=RunStatus.CANCELLING,
                    wake_at=now,
                    expect_status=frozenset({run.status}),
                    ignore_lease=True,
                ),
            )
        except ConflictError:
            continue  # the run moved under us: decide again on fresh state
        if not deliver(run_id):
            wake(run_id)
        return res.run


__all__ = [
    "EXECUTION_TIMEOUT",
    "children",
    "clamp",
    "limit_of",
    "passed",
    "receives",
    "request",
]
