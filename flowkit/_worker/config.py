"""What an activation needs from outside: the worker's configuration (``WorkerConfig``), the
worker seat it runs in (``WorkerHooks``), and who hears of settlements (``Settled``). Kept apart
from
``_worker/runner.py`` so that the drive stays one story: claim → gate → replay → settle."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .._core.clock import Clock
from .._core.limits import DEFAULT_MAX_PAYLOAD_BYTES
from .._core.run import Run
from .._core.telemetry import Telemetry
from .._model.registry import Registry
from .._replay import Activation
from ..events import Event
from ..stores.base import Store
from .recovery import MAX_STORE_FAILURES, LeaseProof
from .step_threads import DEFAULT_STEP_THREADS

Settled = Callable[[str, Run | None], None]
"""Told when a run settles (with its snapshot) or leaves this worker unsettled (``None``):
``Engine.result``'s waiters listen (``Settlements.settled``)."""


@dataclass(eq=False)
class WorkerConfig:
    """What a worker and its activations run with (``Engine`` builds it from its arguments;
    its attributes of the same names read and write these). It lives here, below the worker,
    because every activation reads it."""

    store: Store
    clock: Clock
    rng: random.Random
    instance_id: str
    registry: Registry
    lease_ttl: float = 30.0
    poll_interval: float | None = 1.0  # None: poll only when poked (``TestEnv``)
    max_concurrency: int = 100
    blocked_retry: float = 60.0  # seconds before a blocked run replays its code again
    # False leaves handover to the waiters' re-check timer (benchmarks, diagnostics)
    notify_on_release: bool = True
    # activations of one run that may fail the same non-transient way in a row before the
    # run is ended (failed or blocked: ``ActivationRunner._give_up``)
    max_store_failures: int = MAX_STORE_FAILURES
    # the largest payload an activation records (``Engine(max_payload_bytes=...)``)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    # the threads sync step functions run in (``Engine(step_threads=...)``;
    # ``_worker/step_threads.py``)
    step_threads: int = DEFAULT_STEP_THREADS
    # the event loop waits for each sync step's thread (``TestEnv``: a seed then decides
    # every interleaving, as when sync steps ran on the loop)
    wait_for_step_threads: bool = False
    # note the suspensions whose wake time is only a fallback look
    # (``ActivationRunner.poll_wakes``):
    # ``TestEnv``'s time skipping does not jump to those
    note_poll_wakes: bool = False
    # told the run id after an activation here records an event readers wait for
    # (``event_set``, ``update_replied``): ``Engine`` passes its ``Settlements.recorded``
    recorded: Callable[[str], None] | None = None
    # docs/schedules.md: the schedules this engine declares (``Engine(schedules=...)``) and the age
    # (seconds) past which its worker prunes terminal runs (``Engine(retention=...)``)
    schedules: Mapping[str, Any] | None = None
    retention: float | None = None
    # the poll loop's call to start due schedule ticks (``Schedules.fire_due``): given the
    # poll's ``now``, it answers the next tick (a deadline for the poller) or ``None``
    fire_schedules: Callable[[float], Awaitable[float | None]] | None = None
    # who observes runs, activations and steps (``flowkit.otel.instrument``); None: nobody,
    # at no cost (``_core/telemetry.py``)
    telemetry: Telemetry | None = None


class WorkerHooks(Protocol):
    """What an activation needs of the worker that runs it (``Worker``)."""

    @property
    def running(self) -> bool: ...

    def room(self) -> int:
        """Free activation places (``max_concurrency`` minus the runs here); negative: over."""
        ...

    def attach(self, run_id: str, act: Activation) -> None:
        """``act`` executes ``run_id`` now (lease renewal, cancellation and eviction find it)."""
        ...

    def run_claimed(self, run: Run, events: Sequence[Event]) -> None: ...

    def dispatch(self, run_id: str) -> None: ...

    def again(self, run_id: str) -> None:
        """Activate ``run_id`` once more when its current activation here has ended."""
        ...

    def wake_by(self, at: float) -> None: ...

    def poke(self) -> None: ...

    def track(self, run_id: str, proof: LeaseProof) -> None:
        """The activation of ``run_id`` holds its lease as ``proof`` says: renewals extend it."""
        ...

    def hold(self, run_id: str, unsettled: Awaitable[None]) -> None:
        """A write for ``run_id`` was abandoned and may still commit: activate it here again
        only once ``unsettled`` is done (``StoreUnavailableError.unsettled``)."""
        ...

    def executing(self, run_id: str) -> bool: ...

    def cancel_local(self, run_id: str) -> bool:
        """Deliver a cancellation to the activation executing ``run_id`` here, if any."""
        ...

    def resume(self, run_id: str) -> None:
        """Execute ``run_id``, leased here already, from a fresh read (if it still is)."""
        ...
