"""The worker side of an engine: dispatch, the timer poller, leases, and driving activations.

One ``Worker`` per engine instance. It claims a run (an atomic lease), passes the singleton
gate, replays the body and commits the outcome. All time comes from the engine's clock; the
only randomness (gate jitter) from its RNG."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import ValidationError

from . import _singleton as gate
from ._eager import start_next
from ._history import (
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    SingletonAdmitted,
    SingletonGated,
    SingletonReleased,
)
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
from .stores.base import (
    AppendsEvents,
    CommitResult,
    ConflictError,
    InboxSignal,
    Notify,
    RecordsAdmission,
    Update,
    records_admission,
)

if TYPE_CHECKING:
    from ._engine import Engine

log = logging.getLogger("flowkit")

_NOT_CANCELLING = frozenset(s for s in RunStatus if s.active and s is not RunStatus.CANCELLING)


class _Host:
    """The activation's window on the store: appends fenced by this worker's lease."""

    def __init__(self, worker: Worker, run_id: str) -> None:
        self._w = worker
        self._run_id = run_id

    def now(self) -> float:
        return self._w.engine.clock.now()

    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> bool:
        w = self._w
        # a step's record: events only (AppendsEvents); None: not that simple, commit
        if (
            w.appends is not None
            and events
            and consume_signal is None
            and await w.appends.append_events(self._run_id, w.owner, self.now(), events)
        ):
            return False  # (the run was ``running``, so not cancelling)
        res = await w.store.commit(
            self._run_id,
            self._w.owner,
            self.now(),
            Update(events=events, consume_signal=consume_signal),
        )
        return res.run.status is RunStatus.CANCELLING

    async def peek_signal(self, name: str) -> InboxSignal | None:
        return await self._w.store.peek_signal(self._run_id, name)


class Worker:
    """Claims and executes runs for one engine instance."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.store = engine.store
        self.owner = engine.instance_id
        # the store records steps with append_events (base.AppendsEvents), or None
        self.appends: AppendsEvents | None = (
            cast(AppendsEvents, self.store)
            if getattr(self.store, "appends_events", False)
            else None
        )
        # the store writes ``singleton_admitted`` with the admission marker (RecordsAdmission)
        self.records_admission = records_admission(self.store)
        self._active: dict[str, Activation | None] = {}
        self._again: set[str] = set()
        # Runs handed to this instance while a stale activation of theirs was still winding
        # down here: executed as soon as it has gone (their lease is already ours).
        self._handed_later: set[str] = set()
        # Runs handed to this instance that it will not execute (it is stopping): their
        # leases are given back by ``stop`` so another instance takes them at once.
        self._orphans: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loops: list[asyncio.Task[Any]] = []
        self._poke = asyncio.Event()
        # a run of this instance got a future wake time since the poller last read the store:
        # the earliest such time, and the event that lowers the poller's deadline to it
        # (no store read: the poller only needs to wake up by then)
        self._earliest: float | None = None
        self._rearm = asyncio.Event()
        self._sem = asyncio.Semaphore(engine.max_concurrency)
        self._running = False
        self._unwatch: Callable[[], None] | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def _watch(self) -> None:
        """Poll at once when another process makes work due here (a store with ``watch``:
        ``SqlStore``'s cross-process wake-ups); the timer poll stays as the fallback."""
        watch = getattr(self.store, "watch", None)
        if watch is None:
            return
        try:
            self._unwatch = watch(self.poke)
        except Exception:  # never fatal: the timer poll still finds the work
            log.exception("watching the store for wake-ups failed; polling only")

    def _stop_watching(self) -> None:
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            try:
                unwatch()
            except Exception:
                log.exception("unwatching the store failed")

    def start(self) -> None:
        self._running = True
        self._loops = [
            asyncio.ensure_future(self._poll_loop()),
            asyncio.ensure_future(self._renew_loop()),
        ]
        self._watch()

    async def stop(self, *, graceful: bool = True) -> None:
        self._running = False
        self._stop_watching()
        held = list(self._active)
        for act in list(self._active.values()):
            if act is not None:
                act.evict()
        tasks = [*self._loops, *self._tasks]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
            for t in tasks:  # read every outcome: a crashed instance's errors end here
                if not t.cancelled():
                    t.exception()
        held += [r for r in self._orphans if r not in held]
        self._orphans.clear()
        self._handed_later.clear()
        if graceful:
            now = self.engine.clock.now()
            for run_id in held:
                try:
                    await self.store.commit(run_id, self.owner, now, Update(release_lease=True))
                except Exception:  # best effort: the lease expires anyway
                    log.debug("could not release lease of %s", run_id, exc_info=True)
        self._active.clear()
        self._loops = []
        self._tasks.clear()

    @property
    def busy(self) -> bool:
        return bool(self._active)

    def poke(self) -> None:
        """Re-scan the store now (new due work may exist)."""
        self._poke.set()

    def wake_by(self, at: float) -> None:
        """Poll the store no later than ``at`` (a run this instance committed is due then):
        lowers the poller's deadline without a store read."""
        if self._earliest is None or at < self._earliest:
            self._earliest = at
            self._rearm.set()

    def dispatch(self, run_id: str) -> None:
        """Try to activate ``run_id`` on this instance now."""
        if not self._running:
            return
        if run_id in self._active:
            self._again.add(run_id)
            return
        self._active[run_id] = None
        task = asyncio.ensure_future(self._activate(run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def has_capacity(self) -> bool:
        """Whether a run started here now could be executed at once."""
        return self._running and len(self._active) < self.engine.max_concurrency

    def executing(self, run_id: str) -> bool:
        """Whether ``run_id`` is being claimed or executed by this instance right now."""
        return run_id in self._active

    def run_claimed(self, run: Run, events: Sequence[Event]) -> None:
        """Execute a run this instance already holds the lease of: one it created claimed, or
        one a release handed over (no claim, no history read)."""
        if not self._running:
            self._orphans.add(run.id)
            return
        if run.id in self._active:
            # A stale activation of it is winding down here: once it has gone, re-read the run
            # and drive it only if it is still ours (see ``_resume_handed``).
            self._handed_later.add(run.id)
            return
        self._active[run.id] = None
        # the handed (or just created) run goes next: its handover is the latency that counts
        task = start_next(self._activate(run.id, (run, list(events))))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_local(self, run_id: str) -> bool:
        act = self._active.get(run_id)
        if act is not None:
            act.request_cancel()
            return True
        return False

    # -- loops -------------------------------------------------------------------------
    async def take_back_leases(self) -> None:
        """A worker restarted under the same instance id takes its old leases back at once:
        the activations that held them died with the previous process, so waiting for the
        leases to expire would only delay its runs. Called before ``start``: no lease of this
        worker's own exists yet. (Two live workers sharing an id would fence each other out
        here: instance ids must be unique.)"""
        release = getattr(self.store, "release_leases", None)
        if release is None:
            return
        try:
            released = await release(self.owner, self.engine.clock.now())
        except Exception:  # never fatal: the leases expire anyway
            log.exception("taking back the leases of %s failed", self.owner)
            return
        if released:
            log.info("%s took back %d leased run(s) of its previous run", self.owner, len(released))

    async def _poll_loop(self) -> None:
        eng = self.engine
        names = tuple(eng.registry)
        while self._running:
            self._poke.clear()
            self._rearm.clear()
            self._earliest = None  # the reads below see every commit made before them
            now = eng.clock.now()
            try:
                due = await self.store.due_runs(now, eng.max_concurrency, names)
                for run_id in due:
                    if run_id not in self._active:
                        self.dispatch(run_id)
                if len(due) >= eng.max_concurrency and len(self._active) < eng.max_concurrency:
                    await asyncio.sleep(0)  # a backlog and free capacity: next batch at once
                    continue
                nxt = await self._next_due(now)
            except Exception:  # the store is unavailable: try again after a pause
                log.exception("polling the store failed")
                await self._wait(now + (eng.poll_interval or 1.0))
                continue
            deadline = now + eng.poll_interval if eng.poll_interval is not None else None
            if nxt is not None and nxt > now and (deadline is None or nxt < deadline):
                deadline = nxt
            await self._wait(deadline)

    async def _next_due(self, now: float) -> float | None:
        """When the store next has work due after ``now``: the poller's deadline. Runs leased
        here are left out (their activations are running here and renew their leases).

        Only an instant after ``now`` is a deadline. The earliest due instant of all
        (``next_due_at``) is in the past whenever some run is claimable already: one just
        dispatched above and not claimed yet (a fired timer, a waiter's gate re-check), or a
        run of a workflow this worker does not have. The poller then waits its whole poll
        interval, and every timer due before that fires late; so it asks a store with
        ``next_due_after`` (``stores.base.NextDueAfter``) for the first instant after ``now``."""
        after = getattr(self.store, "next_due_after", None)
        if after is not None:
            due: float | None = await after(now, (self.owner,))
            return due
        return await self.store.next_due_at((self.owner,))

    async def _wait(self, deadline: float | None) -> None:
        """Until poked or ``deadline``, which ``wake_by`` may lower meanwhile."""
        while True:
            if self._earliest is not None and (deadline is None or self._earliest < deadline):
                deadline = self._earliest
            self._rearm.clear()
            poke = asyncio.ensure_future(self._poke.wait())
            rearm = asyncio.ensure_future(self._rearm.wait())
            waits: set[asyncio.Future[Any]] = {poke, rearm}
            if deadline is not None:
                waits.add(asyncio.ensure_future(self.engine.clock.sleep_until(deadline)))
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if done != {rearm}:
                return

    async def _renew_loop(self) -> None:
        eng = self.engine
        while self._running:
            await eng.clock.sleep_until(eng.clock.now() + eng.lease_ttl / 3)
            now = eng.clock.now()
            for run_id, act in list(self._active.items()):
                try:
                    run = await self.store.renew_lease(run_id, self.owner, now + eng.lease_ttl)
                except Exception:  # keep going: the next renewal may succeed in time
                    log.exception("renewing the lease of %s failed", run_id)
                    continue
                if act is None:
                    continue
                if run is None:
                    act.evict()
                elif run.status is RunStatus.CANCELLING:
                    act.request_cancel()

    # -- one activation ----------------------------------------------------------------
    async def _activate(self, run_id: str, claimed: tuple[Run, list[Event]] | None = None) -> None:
        try:
            async with self._sem:
                eng = self.engine
                try:
                    if claimed is not None:
                        await self._drive(*claimed)
                    else:
                        now = eng.clock.now()
                        run = await self.store.claim(run_id, self.owner, now, now + eng.lease_ttl)
                        if run is not None:
                            await self._drive(run)
                except (LeaseLostError, ConflictError):
                    log.info("run %s taken over by another instance", run_id)
                except Exception:
                    # A store or engine failure mid-activation: nothing more is written;
                    # the lease expires and recovery (any instance) claims the run again.
                    log.exception("activation of run %s failed; it will be recovered", run_id)
        finally:
            self._active.pop(run_id, None)
        if run_id in self._handed_later:
            self._handed_later.discard(run_id)
            self._again.discard(run_id)
            task = asyncio.ensure_future(self._resume_handed(run_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if run_id in self._again and self._running:
            self._again.discard(run_id)
            self.dispatch(run_id)

    async def _resume_handed(self, run_id: str) -> None:
        """Execute a run handed over while a stale activation of it was running here, from a
        fresh read: only if it is still active and leased to this instance."""
        try:
            run = await self.store.get_run(run_id)
            if run is None or not run.status.active or run.lease_owner != self.owner:
                return
            events = await self.store.load_events(run_id)
        except Exception:
            log.exception("could not resume handed-over run %s; it will be recovered", run_id)
            return
        self.run_claimed(run, events)

    async def _commit_handing_off(self, run_id: str, now: float, update: Update) -> CommitResult:
        """A commit that may hand runs to us, in a task of its own (started next: a release's
        latency is the handover's) that starts the runs it was handed as soon as the store
        returns, not after the turns of the loop that resuming this caller takes. Safe
        against our own cancellation (stopping): the commit still completes, and the runs it
        handed over are then left to ``stop`` (``run_claimed``), which gives their leases
        back, instead of staying leased to a stopped instance until the lease expires."""
        commit = start_next(self._commit_and_start(run_id, now, update))
        try:
            return await asyncio.shield(commit)
        except asyncio.CancelledError:
            if not commit.done():
                with contextlib.suppress(BaseException):
                    await commit
            raise

    async def _commit_and_start(self, run_id: str, now: float, update: Update) -> CommitResult:
        res = await self.store.commit(run_id, self.owner, now, update)
        for h in res.handed:
            self.run_claimed(h.run, h.events)
        return res

    async def _commit(self, run: Run, update: Update) -> Run:
        eng = self.engine
        now = eng.clock.now()
        n = update.notify
        if n is not None and self._running and len(self._active) <= eng.max_concurrency:
            # Hand the freed slot(s) straight to the next waiter(s), as many as we have room
            # for (this run's own place included): the store admits and leases them to us in
            # this very transaction, and we execute them at once; the rest are only woken.
            update = dataclasses.replace(
                update,
                notify=dataclasses.replace(
                    n,
                    claim_owner=self.owner,
                    lease_expires=now + eng.lease_ttl,
                    max_hand_offs=eng.max_concurrency - len(self._active) + 1,
                ),
            )
        if update.notify is None or update.notify.claim_owner is None:
            res = await self.store.commit(run.id, self.owner, now, update)
            for h in res.handed:  # (none: nothing was handed to this instance)
                self.run_claimed(h.run, h.events)
        else:  # (the runs handed over are started already)
            res = await self._commit_handing_off(run.id, now, update)
        for wid in res.woken:
            eng._wake(wid)
        new = res.run
        if new.status.terminal:
            eng.bus.settled(run.id, new)
        elif new.lease_owner is None and (
            new.status in (RunStatus.CANCELLING, RunStatus.PENDING, RunStatus.RUNNING)
            or (new.wake_at is not None and new.wake_at <= eng.clock.now())
        ):
            self._again.add(run.id)
        elif new.wake_at is not None:
            if new.wake_at <= eng.clock.now():
                eng._poke()
            elif self._running:
                self.wake_by(new.wake_at)
        return new

    async def _drive(self, run: Run, events: list[Event] | None = None) -> None:
        eng = self.engine
        entry = eng.registry.get(run.workflow)
        if entry is None:  # a worker without this workflow: leave it for another one
            await self.store.commit(run.id, self.owner, eng.clock.now(), Update(release_lease=True))
            return
        defn, instance = entry
        if events is None:
            events = await self.store.load_events(run.id)
        cancelling = run.status is RunStatus.CANCELLING
        admitted = recorded = False
        unwritten: list[Event] = []
        notify: Notify | None = None
        key = run.singleton_key
        if key is not None:
            tag = run.singleton_tag
            assert tag is not None
            limit = defn.singleton.limit if defn.singleton is not None else 1
            notify = Notify(run.workflow, tag, limit) if eng.notify_on_release else None
            if not run.admitted:
                if cancelling:  # a cancelled waiter never runs its body
                    await self._commit(
                        run,
                        Update(
                            events=[RunCancelled(at=eng.clock.now())],
                            status=RunStatus.CANCELLED,
                            notify=notify,
                        ),
                    )
                    return
                now = eng.clock.now()
                retry_at = gate.retry_wake_at(now, eng.rng)
                if self.records_admission:  # the store writes singleton_admitted with it
                    ok = await cast(RecordsAdmission, self.store).try_admit_singleton(
                        run.id, tag, run.workflow, limit, retry_at, admitted_at=now
                    )
                    recorded = ok
                else:
                    ok = await self.store.try_admit_singleton(
                        run.id, tag, run.workflow, limit, retry_at
                    )
                if not ok:
                    await self._gated(run, events, key, retry_at, notify)
                    return
            admitted = True
            if not recorded and gate.needs_admitted_event(events):
                # The admission itself is durable on the run row; its history record rides
                # with the activation's next write instead of costing one of its own.
                unwritten.append(SingletonAdmitted(key=key, at=eng.clock.now()))
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
            cancel_requested=cancelling,
            attempt=run.attempt,
            unwritten=unwritten,
        )
        self._active[run.id] = act
        outcome = await act.run()
        if isinstance(outcome, Evicted) and act.store_error is not None:
            log.warning(
                "run %s: the store failed mid-activation (%r); it will be recovered",
                run.id,
                act.store_error,
            )
        await self._settle(run, outcome, admitted, notify, act.pending)

    async def _gated(
        self, run: Run, events: Sequence[Event], key: str, retry_at: float, notify: Notify | None
    ) -> None:
        """Record a denied admission, unless a cancellation arrived during the check (the
        store never parks a cancelling run): a cancelled run is not gated, it settles."""
        now = self.engine.clock.now()
        evs: list[Event] = []
        if gate.needs_gated_event(events):
            evs.append(SingletonGated(key=key, retry_at=retry_at, at=now))
        try:
            await self._commit(
                run, Update(events=evs, release_lease=True, expect_status=_NOT_CANCELLING)
            )
        except ConflictError:
            fresh = await self.store.get_run(run.id)
            if fresh is None or fresh.status is not RunStatus.CANCELLING:
                raise
            await self._commit(
                fresh,
                Update(events=[RunCancelled(at=now)], status=RunStatus.CANCELLED, notify=notify),
            )

    async def _settle(
        self,
        run: Run,
        outcome: Outcome,
        admitted: bool,
        notify: Notify | None,
        pending: Sequence[Event] = (),
    ) -> None:
        """Commit the activation's outcome, together with its deferred step records."""
        eng = self.engine
        now = eng.clock.now()
        release: list[Event] = [*pending]
        if admitted and run.singleton_key is not None:
            release.append(SingletonReleased(key=run.singleton_key, at=now))
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
                        wake_at=round(now + eng.blocked_retry, 6),
                        release_lease=True,
                    ),
                )
            case Evicted():
                pass
