"""The bounds of a run's life as an activation applies them (docs/deadlines-and-dead-letters.md):
a run lost more than ``max_recovery_attempts`` times settles ``dead`` before its body runs
again, a run claimed after its deadline is cancelled, and an activation running as the
deadline passes is cancelled by an in-process timer on the engine clock
(``ActivationRunner.timers``).

Kept apart from ``_worker/runner.py`` so that the drive stays one story: claim → gate → replay →
settle. Every write goes through the drive's own commit (lease fencing, hand-offs, the bus)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from .._core.run import Run, RunStatus
from .._model.definition import WorkflowDefinition
from ..events import CancelRequested, ErrorInfo, Event, RunDead
from ..stores.base import ConflictError, Update
from . import cancellation as _cancellation
from . import gate as gate
from .recovery import Backoff, LeaseProof

if TYPE_CHECKING:
    from .port import RunnerPort, Try

log = logging.getLogger("flowkit")


async def settle_dead(
    drive: RunnerPort, run: Run, defn: WorkflowDefinition, bound: int, t: Try
) -> None:
    """Settle a run ``dead`` whose activation was lost more than ``bound`` times (it is leased
    by ``drive``, its body has not run again): ``singleton_released`` (a slot it held) and
    ``run_dead`` in one commit, which hands its slot to the key's next waiter as any terminal
    settlement does."""
    now = drive.clock.now()
    info = ErrorInfo(
        type="RunDead",
        message=(
            f"its activation was lost {run.recoveries} times (the worker running it died "
            f"or its lease expired), more than max_recovery_attempts={bound}: not run "
            "again; fix the cause and engine.retry it"
        ),
    )
    log.error("run %s is dead: %s", run.id, info.message)
    notify = None
    # (a waiter always notifies: the one behind it may be a head now, and need its timer)
    if run.singleton_key is not None and (drive.config.notify_on_release or not run.admitted):
        notify = gate.release_notify(run, defn)
    t.op = "commit of the dead outcome"
    await drive.commit(
        run,
        Update(
            events=[
                *gate.Gate.released(run, run.admitted, now),
                RunDead(recoveries=run.recoveries, error=info, at=now),
            ],
            status=RunStatus.DEAD,
            error=info.model_dump(),
            notify=notify,
        ),
        t,
    )
    if (tel := drive.config.telemetry) is not None:  # (no activation ran: none counted it)
        tel.settled(run.workflow, RunStatus.DEAD.value)


async def deadline_passed(
    drive: RunnerPort, run: Run, events: Sequence[Event], t: Try
) -> Run | None:
    """The run's deadline passed before this activation (it was parked, or its worker died):
    cancel it. A run no body can receive it in (``_cancellation.receives``) settles ``cancelled``
    at once (``None``); otherwise it goes ``cancelling`` and the body receives the
    cancellation (the run as committed)."""
    fired = await _deadline_passed(drive, run, events, t)
    fresh = fired or await drive.store.get_run(run.id)
    if fresh is not None and fresh.status in (RunStatus.CANCELLING, RunStatus.CANCELLED):
        # its unfinished children are cancelled with it (docs/deadlines-and-dead-letters.md,
        # docs/composing-workflows.md)
        seat = drive.hooks
        await _cancellation.children(
            drive.store,
            drive.clock,
            drive.config.registry,
            run.id,
            settled=drive.settled,
            wake=seat.dispatch,
            deliver=seat.cancel_local,
            telemetry=drive.config.telemetry,
        )
    return fired


async def _deadline_passed(
    drive: RunnerPort, run: Run, events: Sequence[Event], t: Try
) -> Run | None:
    """``deadline_passed`` for the run itself."""
    now = drive.clock.now()
    reason = _cancellation.EXECUTION_TIMEOUT
    t.op = "cancel at the run's deadline"
    # (both commits expect the status the claim left: an ``engine.cancel`` landing since
    # wins, and the run is not cancelled twice)
    try:
        if not _cancellation.receives(run, events):
            limit = _cancellation.limit_of(drive.config.registry, run)
            update = gate.cancel_at_once(run, limit, now, reason)
            if not drive.config.notify_on_release and run.admitted:  # (a waiter notifies)
                update = dataclasses.replace(update, notify=None)
            await drive.commit(run, update, t)
            if (tel := drive.config.telemetry) is not None:  # (settled with no activation)
                tel.settled(run.workflow, RunStatus.CANCELLED.value)
            return None
        return await drive.commit(
            run,
            Update(
                events=[CancelRequested(at=now, reason=reason)],
                status=RunStatus.CANCELLING,
                expect_status=frozenset({run.status}),
            ),
            t,
        )
    except ConflictError:
        fresh = await drive.store.get_run(run.id)
        if (
            fresh is not None
            and fresh.status is RunStatus.CANCELLING
            and fresh.lease_owner == drive.owner
        ):
            return fresh  # cancelled by a user meanwhile: the body receives that one
        drive.follow(fresh)
        return None


@contextlib.asynccontextmanager
async def deadline_watch(drive: RunnerPort, run: Run, proof: LeaseProof) -> AsyncIterator[None]:
    """While the activation of ``run`` lasts: cancel it when its deadline passes (an
    in-process timer, registered in ``drive.timers`` so that ``TestEnv``'s virtual clock
    jumps to it). Nothing to watch without a deadline or once cancellation is requested."""
    at = run.deadline_at
    if at is None or run.status is RunStatus.CANCELLING:
        yield
        return
    token = object()
    drive.timers[token] = at
    watch = asyncio.ensure_future(_deadline_timer(drive, run.id, at, token, proof))
    try:
        yield
    finally:
        drive.timers.pop(token, None)
        watch.cancel()


async def _deadline_timer(
    drive: RunnerPort, run_id: str, at: float, token: object, proof: LeaseProof
) -> None:
    """Cancel ``run_id`` (an activation of ``drive``) once its deadline ``at`` passes, as
    ``Engine.cancel`` does; a failed request is tried again while the activation lasts (else
    the claim that next takes the run cancels it).

    The lease is renewed first: the body's cleanup after the cancellation needs it provably
    live, and the renewal loop may not have had its turn yet (virtual time in ``TestEnv``
    jumps straight to the deadline). A lease found lost cancels nothing here: the instance
    that took the run cancels it when it claims it."""
    backoff = Backoff(drive.clock, drive.config.rng)
    await drive.clock.sleep_until(at)
    drive.timers.pop(token, None)
    seat = drive.hooks
    while True:
        try:
            sent = drive.clock.now()
            until = sent + drive.config.lease_ttl
            if await drive.store.renew_lease(run_id, drive.owner, until) is None:
                return
            proof.granted(sent)
            await _cancellation.request(
                drive.store,
                drive.clock,
                drive.config.registry,
                run_id,
                reason=_cancellation.EXECUTION_TIMEOUT,
                settled=drive.settled,
                wake=seat.dispatch,
                deliver=seat.cancel_local,
                telemetry=drive.config.telemetry,
            )
            return
        except Exception:
            log.warning("run %s: cancelling it at its deadline failed", run_id, exc_info=True)
        await backoff.sleep()


__all__ = ["deadline_passed", "deadline_watch", "settle_dead"]
