"""One activation of a run: claim → singleton gate → replay of the body → settle.

``ActivationRunner`` does it for one worker; the worker keeps the loops and the bookkeeping of what
runs
where (``_worker/worker.py``), and the gate is ``_worker/gate.py``'s. All time comes from the
configured clock, the only randomness (gate jitter, retry backoff) from its RNG. A failed store
call is
retried here from a fresh read (``ActivationRunner.run``; the rules are
``_worker/recovery.py``'s)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from pydantic import ValidationError

from .._core import telemetry as _telemetry
from .._core.run import Run, RunStatus
from .._core.telemetry import ActivationObserver
from .._model.definition import WorkflowDefinition
from .._model.registry import Registry
from .._replay import (
    Activation,
    Cancelled,
    Completed,
    Continued,
    Diverged,
    Evicted,
    Failed,
    Outcome,
    Suspended,
    error_info,
)
from ..errors import CodecError, InvalidInputError, LeaseLostError, SerializationError
from ..events import ErrorInfo, Event, RunCancelled, RunCompleted, RunFailed
from ..stores.base import AppendsEvents, ConflictError, Notify, Update, claims_by_version
from . import cancellation as _cancellation
from . import claim as _claim
from . import continue_as_new as _continue_as_new
from . import deadlines as _deadlines
from . import gate as gate
from .config import Settled, WorkerConfig, WorkerHooks
from .port import Try
from .recovery import Backoff, LeaseProof, bounded, is_transient
from .store_window import StepRunner, StoreWindow, clean

log = logging.getLogger("flowkit")

__all__ = ["ActivationRunner", "Registry", "Settled", "WorkerConfig", "WorkerHooks"]


class ActivationRunner:
    """Runs the activations of one worker (``seat``), one ``run`` call each."""

    def __init__(self, config: WorkerConfig, seat: WorkerHooks, settled: Settled) -> None:
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
        self.gate = gate.Gate(
            config.store, config.clock, config.rng, lambda: config.notify_on_release
        )
        # the store claims by (workflow, version) (base.ClaimsByVersion)
        self.by_version = claims_by_version(self.store)
        self.hooks = seat
        self.settled = settled
        # run id → when its activation tries a failed store call again (``Worker.retry_due``)
        self.retry_at: dict[str, float] = {}
        # in-process deadlines of the activations here (a step's timeout, a run's
        # execution_timeout), by a token of their own: ``Worker.retry_due`` reports the
        # earliest, so that ``TestEnv``'s virtual clock jumps to it as to a timer
        self.timers: dict[object, float] = {}
        # the step attempts running their function here now, by a token each
        # (``StoreWindow.step_began``), and a future resolved when one of them ends: ``TestEnv``
        # holds its virtual clock while some run (``Worker.steps_in_flight``)
        self.in_flight: set[object] = set()
        self.step_ended: asyncio.Future[None] | None = None
        # with ``note_poll_wakes`` (``TestEnv``): run id → the wake time its suspension here
        # wrote when that is only a fallback look (a parent's ``CHILD_POLL``), and the
        # earliest time something durable is due for it (``None``: never)
        self.poll_wakes: dict[str, tuple[float, float | None]] = {}
        # the threads sync steps run in (``store_window.StepRunner``)
        self.steps = StepRunner(config)

    def close(self) -> None:
        """The worker stopped: its step threads end (``StepRunner.close``)."""
        self.steps.close()

    async def run(self, run_id: str, claimed: tuple[Run, list[Event]] | None = None) -> None:
        """Claim ``run_id`` (unless ``claimed``: leased here already, with its history), pass
        its gate, replay its body and commit the outcome. Never raises an ordinary error.

        A failed store call is tried again here, by the lease holder, after a short backoff
        and from a fresh read of the run and its history (what a failed write left, landed
        or not, is what replay sees): at once for a transient failure, as long as the lease
        is provably live; a failure that repeats the same non-transient way
        ``max_store_failures`` times ends the run (``_give_up``). A lost or unprovable lease
        drops the run here, writing nothing more: recovery (any instance) claims it."""
        cfg = self.config
        proof = LeaseProof(self.clock, cfg.lease_ttl)
        self.hooks.track(run_id, proof)
        backoff = Backoff(self.clock, cfg.rng)
        failures = 0
        last: tuple[str, str] | None = None
        first_failure: float | None = None
        handing: Notify | None = None  # a release in flight when the store failed
        fresh = False  # read the run again before the next try
        seen = -1  # the history's length at the last fresh read: a longer one is progress
        deterministic = 0  # non-transient failures of this activation, whatever their kind
        while True:
            t = Try(proof)
            try:
                if fresh:
                    t.op = "get_run"
                    run = await self.store.get_run(run_id)
                    if run is None or not run.status.active or run.lease_owner != self.owner:
                        if handing is not None:  # it landed: runs may have been handed to us
                            await self._adopt(handing)
                        if run is not None and run.continued_as is not None:
                            await _continue_as_new.adopt(self, run)  # (so did a continuation)
                        self.follow(run)
                        return
                    proof.stored(run.lease_expires, cfg.lease_ttl)
                    if not proof.live():
                        log.warning("run %s: its lease can no longer be proven; left", run_id)
                        return
                    t.op = "load_events"
                    claimed = (run, await self.store.load_events(run_id))
                    handing = None
                    first_failure = None  # (the store answered: "kept failing" starts again)
                    if 0 <= seen < len(claimed[1]):  # progress since: the counts start again
                        failures, last, deterministic = 0, None, 0
                        backoff.reset()
                    seen = max(seen, len(claimed[1]))
                await self._once(run_id, claimed, proof, t)
                return
            except (LeaseLostError, ConflictError):
                log.info("run %s taken over by another instance", run_id)
                if cfg.telemetry is not None:
                    cfg.telemetry.lease_lost(t.run.workflow if t.run is not None else None)
                return
            except Exception as exc:
                err = exc
            handing = handing or t.releasing
            unsettled = getattr(err, "unsettled", None)
            if unsettled is not None and not await self._settles(unsettled, proof):
                # an abandoned write of it may still commit: a read now could miss it and run
                # a recorded step again; the run waits here until it has (its lease expires)
                self.hooks.hold(run_id, unsettled)
                log.warning("run %s: an abandoned write may still land; left until it has", run_id)
                return
            now = self.clock.now()
            if first_failure is None:
                first_failure = now
            if isinstance(err, CodecError) and err.missing_key:
                # this process lacks the key (or writes in clear into an encrypted store):
                # the run is fine, leave it for a worker that has the key
                log.error("run %s: %s; left for a worker with the key", run_id, err)
                await self._step_away(run_id, t)
                return
            if not is_transient(err):
                # (consecutive failures of the same kind at the same place)
                sig = (t.op, type(err).__name__)
                failures = failures + 1 if sig == last else 1
                last = sig
                deterministic += 1  # (failures that alternate between kinds: bounded too)
                if failures >= cfg.max_store_failures or deterministic >= 3 * max(
                    1, cfg.max_store_failures
                ):
                    await self._give_up(run_id, t, err, failures)
                    return
            elif now - first_failure > cfg.lease_ttl:
                log.error("run %s: the store kept failing (%r); left to recovery", run_id, err)
                return
            log.warning(
                "run %s: %s failed (%s: %s); trying again",
                run_id,
                t.op,
                type(err).__name__,
                err,
                exc_info=None if is_transient(err) else err,
            )
            at = round(self.clock.now() + backoff.pause(), 6)
            self.retry_at[run_id] = at
            try:
                await self.clock.sleep_until(at)
            finally:
                self.retry_at.pop(run_id, None)
            if not self.hooks.running:
                return
            fresh, claimed = True, None

    async def _step_away(self, run_id: str, t: Try) -> None:
        """Give back the lease of a run this worker cannot execute (it lacks the codec key),
        parked until one lease period from now: any worker may claim it then, and no
        activation of it was lost (a lease left to expire would count as one, and a healthy
        run would end ``dead``). Best effort, bounded: else the lease expires. (The store
        checks the owner: it gives back only a lease that is still this worker's, even one
        whose claim failed to decode.)"""
        now = self.clock.now()
        deadline = t.run.deadline_at if t.run is not None else None
        update = Update(
            status=RunStatus.SUSPENDED,
            wake_at=_cancellation.clamp(round(now + self.config.lease_ttl, 6), deadline),
            release_lease=True,
        )
        try:
            await bounded(
                self.clock,
                self.store.commit(run_id, self.owner, now, update),
                self.config.lease_ttl / 3,
            )
        except CodecError:
            pass  # (the write landed; the run it returns cannot be read here)
        except Exception:
            log.debug("could not give back the lease of %s", run_id, exc_info=True)

    async def _settles(self, unsettled: Awaitable[None], proof: LeaseProof) -> bool:
        """Wait for an abandoned call to have really returned, while the lease is provable:
        whether it has."""
        fut = asyncio.ensure_future(unsettled)
        if fut.done():
            return True
        if not proof.live():
            return False
        timer = asyncio.ensure_future(self.clock.sleep_until(proof.until))
        try:
            await asyncio.wait({fut, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        return fut.done()

    async def _once(
        self,
        run_id: str,
        claimed: tuple[Run, list[Event]] | None,
        proof: LeaseProof,
        t: Try,
    ) -> None:
        """One try of the activation; raises what failed (``t`` says where it was)."""
        cfg = self.config
        run: Run | None
        events: list[Event] | None = None
        if claimed is not None:
            run, events = claimed
            if run.lease_owner == self.owner:
                proof.stored(run.lease_expires, cfg.lease_ttl)
        else:
            now = self.clock.now()
            t.op = "claim"
            run = await _claim.claim(self, run_id, now)  # (a gated re-check decided in it)
            if run is None:
                return
            proof.granted(now)
        t.run = run
        entry = cfg.registry.get(run.workflow, run.workflow_version)
        if entry is None:
            # a worker without this workflow or version (a store without ``claims_by_version``,
            # or a hand-off of a store that ignores ``Notify.claim_versions``): leave it for
            # another one; a run always resumes on the version it started on
            t.op = "lease release"
            now = self.clock.now()
            await self.store.commit(run.id, self.owner, now, Update(release_lease=True))
            return
        defn, instance = entry
        if events is None:
            t.op = "load_events"
            events = await self.store.load_events(run.id)
        bound = defn.max_recovery_attempts
        if bound is not None and run.recoveries > bound:
            await _deadlines.settle_dead(self, run, defn, bound, t)  # poison: never run it again
            return
        if _cancellation.passed(run, self.clock.now()):
            fired = await _deadlines.deadline_passed(self, run, events, t)
            if fired is None:
                return  # settled cancelled at once
            run = fired
        async with _deadlines.deadline_watch(self, run, proof):
            await self._activate(run, events, defn, instance, proof, t)

    async def _activate(
        self,
        run: Run,
        events: list[Event],
        defn: WorkflowDefinition,
        instance: Any,
        proof: LeaseProof,
        t: Try,
    ) -> None:
        """Pass the gate, replay the body and settle: the rest of ``_once``."""
        cfg = self.config
        admitted = False
        unwritten: list[Event] = []
        notify: Notify | None = None
        if run.singleton_key is not None:
            release = gate.release_notify(run, defn)
            notify = release if cfg.notify_on_release else None
            t.notify = notify
            if run.admitted:
                unwritten = self.gate.admitted_record(run, events)
            else:
                if not proof.live():
                    raise LeaseLostError(run.id)
                t.op = "singleton admission"
                # (a waiter settling here always notifies: the next one may need its timer)
                passed = await self.gate.admit(run, events, defn, release, self._gate_commit(t))
                if passed is None:
                    return  # parked behind the key's holders, or cancelled
                unwritten = passed
            admitted = True
        t.admitted = admitted
        tel = cfg.telemetry
        if tel is None:
            await self._body(run, events, defn, instance, proof, t, notify, unwritten, None)
        else:  # (observed: an activation span, the step attempts', the metrics)
            obs = _telemetry.begin(tel, run, events, () if run.admitted else unwritten)
            await _telemetry.observed(
                tel,
                obs,
                run.workflow,
                self._body(run, events, defn, instance, proof, t, notify, unwritten, obs),
            )

    async def _body(
        self,
        run: Run,
        events: list[Event],
        defn: WorkflowDefinition,
        instance: Any,
        proof: LeaseProof,
        t: Try,
        notify: Notify | None,
        unwritten: list[Event],
        obs: ActivationObserver | None,
    ) -> tuple[Outcome, Any]:
        """Replay the body and settle (the rest of ``_activate``): the outcome and its
        error, for an observer (``_telemetry.observed``)."""
        admitted = t.admitted
        try:
            value = defn.input_adapter.validate_python(run.input)
        except ValidationError as exc:  # the stored input no longer fits the current code
            failed = Failed(error_info(exc))
            await self.settle(run, failed, admitted, notify, unwritten, t)
            return failed, failed.error
        act = Activation(
            defn,
            instance,
            run.id,
            value,
            events,
            StoreWindow(self, run, proof, obs, events),
            cancel_requested=run.status is RunStatus.CANCELLING,
            attempt=run.attempt,
            unwritten=unwritten,
            resumed=bool(run.waiting_signals),
        )
        self.hooks.attach(run.id, act)
        t.op = "recording the run's events"
        outcome = await act.run()
        if isinstance(outcome, Continued):  # (a pending cancel wins over the continuation)
            if act.st.cancel_requested:
                outcome = Cancelled()
            else:
                pending = act.pending
                trace = _telemetry.onward_tags(obs, events)  # (the successor joins the trace)
                # (what it committed: ``failed`` or ``cancelled`` when no successor was made)
                outcome = await _continue_as_new.settle(
                    self, run, outcome.input, defn, admitted, notify, pending, t, trace
                )
                return outcome, outcome.error if isinstance(outcome, Failed) else None
        if isinstance(outcome, Evicted):
            if act.store_error is not None:
                raise act.store_error
            if not proof.live() and self.hooks.running:
                log.warning("run %s: its lease can no longer be proven; dropped here", run.id)
        await self.settle(run, outcome, admitted, notify, act.pending, t)
        return outcome, outcome.error if isinstance(outcome, Failed) else None

    async def _give_up(self, run_id: str, t: Try, err: Exception, tries: int) -> None:
        """End a run whose store writes failed the same non-transient way ``tries`` times.

        Bad data (``SerializationError``, ``InvalidInputError``: a value the store cannot
        hold, which the code will produce again) fails the run: final, its singleton slot
        released. Anything else (a ``CodecError``: a missing key, a tampered value; an
        unknown error) blocks it: an operator can fix the cause, and it runs again after
        ``blocked_retry``. When even the ``failed`` commit cannot be written, the run is
        blocked; when nothing can be written, it is left to recovery."""
        info = ErrorInfo(
            type=type(err).__name__,
            message=clean(f"{t.op} failed {tries} times in a row: {err}"),
        )
        log.error("run %s: %s; giving up", run_id, info.message)
        run = t.run
        if run is not None and isinstance(err, SerializationError | InvalidInputError):
            # with the step records the failed commit carried, else without (they may be
            # what the store refuses)
            for pending in dict.fromkeys((tuple(t.pending), ())):
                try:
                    await self.settle(run, Failed(info), t.admitted, t.notify, pending, t)
                    if (tel := self.config.telemetry) is not None:  # (its activation ended lost)
                        tel.settled(run.workflow, RunStatus.FAILED.value)
                    return
                except (LeaseLostError, ConflictError):
                    return
                except Exception:
                    log.warning("run %s: its failure cannot be recorded", run_id, exc_info=True)
        if not t.proof.live():
            return  # (nothing may be written: recovery takes the run)
        now = self.clock.now()
        try:
            await self._commit_checked(
                run_id,
                Update(
                    status=RunStatus.BLOCKED,
                    error=info.model_dump(),
                    wake_at=_cancellation.clamp(
                        round(now + self.config.blocked_retry, 6),
                        run.deadline_at if run is not None else None,
                    ),
                    release_lease=True,
                ),
            )
        except (LeaseLostError, ConflictError):
            pass
        except Exception:
            log.exception("run %s: cannot be blocked either; left to recovery", run_id)

    async def _commit_checked(self, run_id: str, update: Update) -> None:
        """A commit for a run this drive may not have read (``_give_up``)."""
        res = await self.store.commit(run_id, self.owner, self.clock.now(), update)
        self.follow(res.run)

    async def _adopt(self, notify: Notify) -> None:
        """A release whose commit failed in flight had landed: the runs it handed to this
        instance are leased here but nobody executes them. Find them (the key's active runs
        leased here and not running here) and resume them at once, so that the key is not
        blocked until their leases expire."""
        try:
            runs = await self.store.list_runs(tag=notify.tag)
        except Exception:
            log.warning("could not look for runs handed over on %s", notify.tag, exc_info=True)
            return
        for r in runs:
            if r.status.active and r.lease_owner == self.owner and not self.hooks.executing(r.id):
                self.hooks.resume(r.id)

    def follow(self, new: Run | None) -> None:
        """Act on what a fresh read or a commit says of a run this drive holds no more:
        tell ``Engine.result`` of a settlement, and come back for a run that is due again."""
        if new is None:
            return
        seat = self.hooks
        if new.status.terminal:
            self.settled(new.id, new)
        elif new.lease_owner is None and (
            new.status in (RunStatus.PENDING, RunStatus.RUNNING)
            or (new.status is RunStatus.CANCELLING and new.wake_at is None)
            or (new.wake_at is not None and new.wake_at <= self.clock.now())
        ):
            seat.again(new.id)
        elif new.wake_at is not None:
            if new.wake_at <= self.clock.now():
                seat.poke()
            elif seat.running:
                seat.wake_by(new.wake_at)

    async def settle(
        self,
        run: Run,
        outcome: Outcome,
        admitted: bool,
        notify: Notify | None,
        pending: Sequence[Event],
        t: Try,
    ) -> None:
        """Commit the activation's outcome, together with its deferred step records."""
        now = self.clock.now()
        t.op = f"commit of the {type(outcome).__name__.lower()} outcome"
        self.poll_wakes.pop(run.id, None)
        t.pending = list(pending)
        commit = self._committer(t)
        release: list[Event] = [*pending, *gate.Gate.released(run, admitted, now)]
        match outcome:
            case Completed(output):
                await commit(
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
                await commit(
                    run,
                    Update(
                        events=[*release, RunFailed(error=error, at=now)],
                        status=RunStatus.FAILED,
                        error=error.model_dump(),
                        notify=notify,
                    ),
                )
            case Cancelled():
                await commit(
                    run,
                    Update(
                        events=[*release, RunCancelled(at=now)],
                        status=RunStatus.CANCELLED,
                        notify=notify,
                    ),
                )
            case Suspended(wake_at, _, True):
                # a compensation's retry backoff: the run stays ``cancelling`` (no status:
                # a suspended cancelling run would be due at once), due at ``wake_at``
                await commit(
                    run,
                    Update(
                        events=pending,
                        wake_at=wake_at,
                        waiting_signals=(),
                        error=None,
                        release_lease=True,
                    ),
                )
            case Suspended(wake_at, signals, _, firm_wake_at):
                wake = _cancellation.clamp(wake_at, run.deadline_at)
                await commit(
                    run,
                    Update(
                        events=pending,
                        status=RunStatus.SUSPENDED,
                        wake_at=wake,
                        waiting_signals=signals,
                        error=None,
                        release_lease=True,
                    ),
                )
                firm = _cancellation.clamp(firm_wake_at, run.deadline_at)
                if self.config.note_poll_wakes and wake is not None and wake != firm:
                    self.poll_wakes[run.id] = (wake, firm)
            case Diverged(err):
                log.warning("run %s blocked: %s", run.id, err)
                await commit(
                    run,
                    Update(
                        events=pending,
                        status=RunStatus.BLOCKED,
                        error={"type": "NonDeterminismError", "message": str(err)},
                        wake_at=_cancellation.clamp(
                            round(now + self.config.blocked_retry, 6), run.deadline_at
                        ),
                        release_lease=True,
                    ),
                )
            case Evicted() | Continued(_):
                pass  # (a continuation settles by ``_continue_as_new.settle``)

    def _committer(self, t: Try) -> gate.Commit:
        """``commit`` for the try ``t`` (the gate writes through it too)."""

        async def commit(run: Run, update: Update) -> Run:
            return await self.commit(run, update, t)

        return commit

    def _gate_commit(self, t: Try) -> gate.Commit:
        """``_committer`` for the gate: a run it settles (``cancelled``: a cancellation
        landed before its admission) had no activation, so it is counted here."""

        async def commit(run: Run, update: Update) -> Run:
            res = await self.commit(run, update, t)
            if res.status.terminal and (tel := self.config.telemetry) is not None:
                tel.settled(res.workflow, res.status.value)
            return res

        return commit

    async def commit(self, run: Run, update: Update, t: Try) -> Run:
        """Commit under this worker's lease, then act on what the commit says: start the runs
        it handed over, dispatch the runs it woke, tell ``Engine.result`` of a settlement, and
        come back for a run that is due again. Nothing is written once the lease cannot be
        proven live (``LeaseLostError``)."""
        if not t.proof.live():
            raise LeaseLostError(run.id)
        seat = self.hooks
        now = self.clock.now()
        t.releasing = update.notify
        if update.notify is not None and seat.running and (room := seat.room()) >= 0:
            # Hand the freed slot(s) straight to the next waiter(s), as many as we have room
            # for (this run's own place included): the store admits and leases them to us in
            # this very transaction, and we execute them at once; the rest are only woken.
            res = await gate.commit_handing_off(
                self.store,
                run.id,
                self.owner,
                now,
                gate.hand_off(
                    update,
                    self.owner,
                    now + self.config.lease_ttl,
                    room + 1,
                    frozenset(self.config.registry.versions(run.workflow)),
                ),
                seat.run_claimed,
            )
        else:
            res = await self.store.commit(run.id, self.owner, now, update)
            for h in res.handed:  # (none: nothing was handed to this instance)
                seat.run_claimed(h.run, h.events)
        t.releasing = None
        if res.handed and self.config.telemetry is not None:  # (admitted by this commit)
            _telemetry.handed(self.config.telemetry, [h.run for h in res.handed], now)
        for wid in res.woken:
            seat.dispatch(wid)
        self.follow(res.run)
        return res.run
