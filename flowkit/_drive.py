"""One activation of a run: claim → singleton gate → replay of the body → settle.

``Drive`` does it for one worker; the worker keeps the loops and the bookkeeping of what runs
where (``_worker.py``), and the gate is ``_gate.py``'s. All time comes from the configured
clock, the only randomness (gate jitter) from its RNG."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from pydantic import ValidationError

from . import _gate as gate
from ._clock import Clock
from ._definition import WorkflowDefinition
from ._limits import DEFAULT_MAX_PAYLOAD_BYTES
from ._replay import (
    Activation,
    Cancelled,
    Completed,
    Diverged,
    Evicted,
    Failed,
    Outcome,
    Suspended,
    error_info,
)
from ._run import Run, RunStatus
from .errors import LeaseLostError
from .events import Event, RunCancelled, RunCompleted, RunFailed
from .stores.base import AppendsEvents, ConflictError, InboxSignal, Notify, Store, Update

log = logging.getLogger("flowkit")

Registry = dict[str, tuple[WorkflowDefinition, Any]]
"""Workflow name → (definition, the registered instance whose ``run`` is the body)."""
Settled = Callable[[str, Run | None], None]
"""Told when a run settles (with its snapshot) or leaves this worker unsettled (``None``):
``Engine.result``'s waiters listen (``Bus.settled``)."""


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
    # the largest payload an activation records (``Engine(max_payload_bytes=...)``)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES


class Seat(Protocol):
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


class _Host:
    """The activation's window on the store: appends fenced by this worker's lease."""

    __slots__ = ("_d", "_run_id")

    def __init__(self, drive: Drive, run_id: str) -> None:
        self._d = drive
        self._run_id = run_id

    def now(self) -> float:
        return self._d.clock.now()

    @property
    def max_payload_bytes(self) -> int:
        return self._d.config.max_payload_bytes

    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> bool:
        d = self._d
        # a step's record: events only (AppendsEvents); None: not that simple, commit
        if (
            d.appends is not None
            and events
            and consume_signal is None
            and await d.appends.append_events(self._run_id, d.owner, d.clock.now(), events)
        ):
            return False  # (the run was ``running``, so not cancelling)
        res = await d.store.commit(
            self._run_id,
            d.owner,
            d.clock.now(),
            Update(events=events, consume_signal=consume_signal),
        )
        return res.run.status is RunStatus.CANCELLING

    async def peek_signal(self, name: str) -> InboxSignal | None:
        return await self._d.store.peek_signal(self._run_id, name)


class Drive:
    """Runs the activations of one worker (``seat``), one ``run`` call each."""

    def __init__(self, config: WorkerConfig, seat: Seat, settled: Settled) -> None:
        self.config = config
        self.store = config.store
        self.clock = config.clock
        self.owner = config.instance_id
        # the store records steps with append_events (base.AppendsEvents), or None
        self.appends: AppendsEvents | None = (
            cast(AppendsEvents, self.store)
            if getattr(self.store, "appends_events", False)
            else None
        )
        self.gate = gate.Gate(config.store, config.clock, config.rng)
        self._seat = seat
        self._settled = settled

    async def run(self, run_id: str, claimed: tuple[Run, list[Event]] | None = None) -> None:
        """Claim ``run_id`` (unless ``claimed``: leased here already, with its history), pass
        its gate, replay its body and commit the outcome. Never raises an ordinary error: a
        lost lease is logged, any other failure leaves the run to recovery (its lease
        expires and any instance claims it again)."""
        cfg = self.config
        run: Run | None
        events: list[Event] | None = None
        try:
            if claimed is not None:
                run, events = claimed
            else:
                now = self.clock.now()
                run = await self.store.claim(run_id, self.owner, now, now + cfg.lease_ttl)
                if run is None:
                    return
            entry = cfg.registry.get(run.workflow)
            if entry is None:  # a worker without this workflow: leave it for another one
                await self.store.commit(
                    run.id, self.owner, self.clock.now(), Update(release_lease=True)
                )
                return
            defn, instance = entry
            if events is None:
                events = await self.store.load_events(run.id)
            admitted = False
            unwritten: list[Event] = []
            notify: Notify | None = None
            if run.singleton_key is not None:
                release = gate.release_notify(run, defn)
                notify = release if cfg.notify_on_release else None
                if run.admitted:
                    unwritten = self.gate.admitted_record(run, events)
                else:
                    passed = await self.gate.admit(run, events, defn, notify, self._commit)
                    if passed is None:
                        return  # parked behind the key's holders, or cancelled
                    unwritten = passed
                admitted = True
            try:
                value = defn.input_adapter.validate_python(run.input)
            except ValidationError as exc:  # the stored input no longer fits the current code
                await self._settle(run, Failed(error_info(exc)), admitted, notify, unwritten)
                return
            act = Activation(
                defn,
                instance,
                run.id,
                value,
                events,
                _Host(self, run.id),
                cancel_requested=run.status is RunStatus.CANCELLING,
                attempt=run.attempt,
                unwritten=unwritten,
            )
            self._seat.attach(run.id, act)
            outcome = await act.run()
            if isinstance(outcome, Evicted) and act.store_error is not None:
                log.warning(
                    "run %s: the store failed mid-activation (%r); it will be recovered",
                    run.id,
                    act.store_error,
                )
            await self._settle(run, outcome, admitted, notify, act.pending)
        except (LeaseLostError, ConflictError):
            log.info("run %s taken over by another instance", run_id)
        except Exception:
            # A store or engine failure mid-activation: nothing more is written; the lease
            # expires and recovery (any instance) claims the run again.
            log.exception("activation of run %s failed; it will be recovered", run_id)

    async def _settle(
        self,
        run: Run,
        outcome: Outcome,
        admitted: bool,
        notify: Notify | None,
        pending: Sequence[Event] = (),
    ) -> None:
        """Commit the activation's outcome, together with its deferred step records."""
        now = self.clock.now()
        release: list[Event] = [*pending, *gate.Gate.released(run, admitted, now)]
        match outcome:
            case Completed(output):
                await self._commit(
                    run,
                    Update(
                        events=[*release, RunCompleted(output=output, at=now)],
                        status=RunStatus.COMPLETED,
                        output=output,
                        error=None,
                        notify=notify,
                    ),
                )
            case Failed(error):
                await self._commit(
                    run,
                    Update(
                        events=[*release, RunFailed(error=error, at=now)],
                        status=RunStatus.FAILED,
                        error=error.model_dump(),
                        notify=notify,
                    ),
                )
            case Cancelled():
                await self._commit(
                    run,
                    Update(
                        events=[*release, RunCancelled(at=now)],
                        status=RunStatus.CANCELLED,
                        notify=notify,
                    ),
                )
            case Suspended(wake_at, signals):
                await self._commit(
                    run,
                    Update(
                        events=pending,
                        status=RunStatus.SUSPENDED,
                        wake_at=wake_at,
                        waiting_signals=signals,
                        error=None,
                        release_lease=True,
                    ),
                )
            case Diverged(err):
                log.warning("run %s blocked: %s", run.id, err)
                await self._commit(
                    run,
                    Update(
                        events=pending,
                        status=RunStatus.BLOCKED,
                        error={"type": "NonDeterminismError", "message": str(err)},
                        wake_at=round(now + self.config.blocked_retry, 6),
                        release_lease=True,
                    ),
                )
            case Evicted():
                pass

    async def _commit(self, run: Run, update: Update) -> Run:
        """Commit under this worker's lease, then act on what the commit says: start the runs
        it handed over, dispatch the runs it woke, tell ``Engine.result`` of a settlement, and
        come back for a run that is due again."""
        seat = self._seat
        now = self.clock.now()
        if update.notify is not None and seat.running and (room := seat.room()) >= 0:
            # Hand the freed slot(s) straight to the next waiter(s), as many as we have room
            # for (this run's own place included): the store admits and leases them to us in
            # this very transaction, and we execute them at once; the rest are only woken.
            res = await gate.commit_handing_off(
                self.store,
                run.id,
                self.owner,
                now,
                gate.hand_off(update, self.owner, now + self.config.lease_ttl, room + 1),
                seat.run_claimed,
            )
        else:
            res = await self.store.commit(run.id, self.owner, now, update)
            for h in res.handed:  # (none: nothing was handed to this instance)
                seat.run_claimed(h.run, h.events)
        for wid in res.woken:
            seat.dispatch(wid)
        new = res.run
        if new.status.terminal:
            self._settled(run.id, new)
        elif new.lease_owner is None and (
            new.status in (RunStatus.CANCELLING, RunStatus.PENDING, RunStatus.RUNNING)
            or (new.wake_at is not None and new.wake_at <= self.clock.now())
        ):
            seat.again(run.id)
        elif new.wake_at is not None:
            if new.wake_at <= self.clock.now():
                seat.poke()
            elif seat.running:
                seat.wake_by(new.wake_at)
        return new
