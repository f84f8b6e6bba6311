"""The worker of an engine instance: dispatch, the timer poller, lease renewal, and the
bookkeeping of the runs executing here. Each activation is a ``ActivationRunner.run``
(``_worker/runner.py``).

A ``Worker`` knows its ``WorkerConfig`` and one callback (``settled``); it never sees the
``Engine`` that owns it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from .._core.ready_queue import start_next
from .._core.run import Run, RunStatus
from .._replay import Activation
from ..events import Event
from ..stores.base import (
    ClaimsByVersion,
    RecordsWorkers,
    Update,
    claims_by_version,
    records_workers,
)
from .recovery import Backoff, LeaseProof, bounded
from .retention import retention_loop
from .runner import ActivationRunner, Settled, WorkerConfig

log = logging.getLogger("flowkit")

WORKER_REFRESH = 60.0
"""Seconds between a worker's records of itself (``stores.base.RecordsWorkers``)."""
WORKER_SEEN_WINDOW = 5 * WORKER_REFRESH
"""A worker seen within this many seconds counts as live: ``flowkit runs``/``show`` and
``Engine.result``'s timeout message say when no such worker has a run's version. (A worker
that stops cleanly leaves an entry with no version: it counts for nothing at once.)"""

__all__ = ["WORKER_REFRESH", "WORKER_SEEN_WINDOW", "Worker", "WorkerConfig", "no_live_worker"]


async def no_live_worker(store: Any, runs: Sequence[Run], now: float) -> set[str] | None:
    """The ids of the ``runs`` that no worker seen within ``WORKER_SEEN_WINDOW`` before
    ``now`` can run: none has the run's ``(workflow, version)`` on a store that sees the run's
    namespace (an unscoped worker sees them all; ``stores.base.RecordsWorkers``). ``None``
    when the store does not keep workers (nothing can be said)."""
    if not records_workers(store):
        return None
    seen: dict[str | None, set[tuple[str, str]]] = {}
    for w in await cast(RecordsWorkers, store).workers():
        if w.last_seen >= now - WORKER_SEEN_WINDOW:
            seen.setdefault(w.namespace, set()).update(w.versions)
    anywhere = seen.get(None, set())
    return {
        r.id
        for r in runs
        if (pair := (r.workflow, r.workflow_version)) not in anywhere
        and pair not in seen.get(r.namespace, ())
    }


class Worker:
    """Claims and executes runs for one engine instance (``instance_id``)."""

    def __init__(self, config: WorkerConfig, settled: Settled) -> None:
        """``settled(run_id, run)`` is told of every settlement here (``run``: the settled
        snapshot) and of every activation that ends without one (``None``)."""
        self.config = config
        self.store = config.store
        self.clock = config.clock
        self.owner = config.instance_id
        self._settled = settled
        self._drive = ActivationRunner(config, self, settled)
        self._active: dict[str, Activation | None] = {}
        # what each activation here can prove of its lease (renewals extend it), and the
        # renewals in flight (a run's next renewal waits for its last one, no other run does)
        self._leases: dict[str, LeaseProof] = {}
        self._renewing: set[str] = set()
        self._again: set[str] = set()
        # Runs handed to this instance while a stale activation of theirs was still winding
        # down here: executed as soon as it has gone (their lease is already ours).
        self._handed_later: set[str] = set()
        # Runs handed to this instance that it will not execute (it is stopping): their
        # leases are given back by ``stop`` so another instance takes them at once.
        self._orphans: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # this worker's entry being written (``_make_known``; each bounded)
        self._recording: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[Any]] = []
        self._poke = asyncio.Event()
        # a run of this instance got a future wake time since the poller last read the store:
        # the earliest such time, and the event that lowers the poller's deadline to it
        # (no store read: the poller only needs to wake up by then)
        self._earliest: float | None = None
        # the last poll found a full batch due (more may wait): a freed place polls again
        self._backlog = False
        self._rearm = asyncio.Event()
        self._sem = asyncio.Semaphore(config.max_concurrency)
        # runs with an abandoned write that may still commit (``hold``)
        self._unsettled: dict[str, asyncio.Future[None]] = {}
        self.running = False
        # ``drain``: no run is claimed or started here any more; the leases are still renewed
        self.draining = False
        self._idle = asyncio.Event()  # (set when draining and no activation is left here)
        self._unwatch: Callable[[], None] | None = None
        self._next_known: float | None = None  # when to make this worker known again

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
        self.running = True
        self._loops = [
            asyncio.ensure_future(self._poll_loop()),
            asyncio.ensure_future(self._renew_loop()),
        ]
        # (``Engine(retention=...)``: docs/search-and-retention.md)
        if self.config.retention is not None:
            self._loops.append(asyncio.ensure_future(retention_loop(self.config, self._on)))
        self._watch()
        self._make_known()

    def _on(self) -> bool:
        return self.running

    def _make_known(self) -> None:
        """Tell the store which ``(workflow, version)`` pairs this instance runs, now and then
        every ``WORKER_REFRESH`` seconds (from the lease renewal loop: no extra timer, never
        per run), so tools can say when no live worker has a run's version
        (``stores.base.RecordsWorkers``). Best effort: a failure is logged, never fatal."""
        if not records_workers(self.store):
            return
        now = self.clock.now()
        self._next_known = now + WORKER_REFRESH
        task = asyncio.ensure_future(self._record_worker(now))
        self._recording.add(task)  # (not cancelled by a clean stop: ``_make_gone`` waits)
        task.add_done_callback(self._recording.discard)

    async def _record_worker(self, now: float) -> None:
        try:
            await bounded(
                self.clock,
                cast(RecordsWorkers, self.store).record_worker(
                    self.owner, self.config.registry.pairs(), now
                ),
                self.config.lease_ttl / 3,
            )
        except Exception:
            log.warning("could not make worker %s known to the store", self.owner, exc_info=True)

    async def _make_gone(self) -> None:
        """Tell the store this instance runs nothing any more (a clean stop: a drain, the
        engine closed): its entry keeps no version, so a run of a version no other live
        worker has is said to wait at once, not once the entry is ``WORKER_SEEN_WINDOW``
        old. A crash says nothing (the instance may be back). Best effort, bounded. The
        entry this worker is still writing lands first: a write cancelled mid-way may land
        anyway (``SqlStore``'s I/O threads), and after this one it would say it runs them."""
        if not records_workers(self.store):
            return
        if self._recording:
            await asyncio.wait(list(self._recording))
        try:
            await bounded(
                self.clock,
                cast(RecordsWorkers, self.store).record_worker(self.owner, (), self.clock.now()),
                self.config.lease_ttl / 3,
            )
        except Exception:
            log.debug("could not tell the store worker %s is gone", self.owner, exc_info=True)

    async def stop(self, *, graceful: bool = True) -> None:
        """Stop the loops and abandon the activations here. ``graceful`` gives their leases
        back so another instance takes the runs at once; otherwise (a crash) they expire."""
        self.running = False
        self._stop_watching()
        held = list(self._active)
        for act in list(self._active.values()):
            if act is not None:
                act.evict()
        if not graceful:
            self._tasks |= self._recording  # (a crash: nothing more is written)
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
        if graceful:  # (the leases back and this instance gone, at once: each is bounded)
            now = self.clock.now()
            await asyncio.gather(
                self._make_gone(), *(self._give_back(run_id, now) for run_id in held)
            )
        self._drive.close()  # (its step threads: those busy are abandoned, not waited for)
        self._active.clear()
        self._leases.clear()
        self._renewing.clear()
        self._loops = []
        self._tasks.clear()
        for run_id in held:  # (an activation cancelled before it began told nobody)
            self._settled(run_id, None)

    async def drain(self, grace: float) -> None:
        """Stop gracefully (``Engine.serve``, ``flowkit worker`` on SIGTERM): claim nothing
        more, let each activation here reach a durable point (its running steps end and are
        recorded; no new step starts) for at most ``grace`` seconds while its lease is still
        renewed, then ``stop``: what is left is abandoned, and every lease is given back so
        another worker claims the runs at once rather than after the lease TTL."""
        self.draining = True
        self._stop_watching()
        for t in self._loops[:1]:  # the poll loop (the renewals go on)
            t.cancel()
        held = set(self._active)
        for act in self._active.values():
            if act is not None:
                act.drain()
        if self._active:
            self._idle.clear()
            waits: set[asyncio.Future[Any]] = {
                asyncio.ensure_future(self._idle.wait()),
                asyncio.ensure_future(self.clock.sleep_until(self.clock.now() + grace)),
            }
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        # the runs whose activation stopped early keep their lease here: given back too
        self._orphans.update(held)
        await self.stop(graceful=True)

    async def _give_back(self, run_id: str, now: float) -> None:
        """Release one lease on stopping; best effort, bounded: the lease expires anyway."""
        update = Update(release_lease=True)
        try:
            await bounded(
                self.clock,
                self.store.commit(run_id, self.owner, now, update),
                self.config.lease_ttl / 3,
            )
        except Exception:
            log.debug("could not release lease of %s", run_id, exc_info=True)

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
        if not self.running or self.draining or self._unsettled_write(run_id):
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
        return (
            self.running and not self.draining and len(self._active) < self.config.max_concurrency
        )

    def executing(self, run_id: str) -> bool:
        """Whether ``run_id`` is being claimed or executed by this instance right now."""
        return run_id in self._active

    def retry_due(self) -> float | None:
        """The earliest instant an activation here tries a failed store call again, or an
        in-process deadline of one (``ActivationRunner.timers``) passes."""
        d = self._drive
        return min((*d.retry_at.values(), *d.timers.values()), default=None)

    def poll_wake(self, run_id: str) -> tuple[float, float | None] | None:
        """The wake time ``run_id``'s last suspension here wrote, if that is only a fallback
        look, with the earliest time something durable is due for it
        (``ActivationRunner.poll_wakes``)."""
        return self._drive.poll_wakes.get(run_id)

    def steps_in_flight(self) -> frozenset[object]:
        """The step attempts running their function here now (a token each)."""
        return frozenset(self._drive.in_flight)

    def step_ended(self) -> asyncio.Future[None]:
        """A future resolved when the next step attempt running here ends."""
        d = self._drive
        if d.step_ended is None or d.step_ended.done():
            d.step_ended = asyncio.get_running_loop().create_future()
        return d.step_ended

    def holds(self, run_id: str) -> bool:
        """Whether an activation of ``run_id`` (claimed, past its gate) runs here: it ends by
        telling ``settled``, with the snapshot or ``None``."""
        return self._active.get(run_id) is not None

    def run_claimed(self, run: Run, events: Sequence[Event]) -> None:
        """Execute a run this instance already holds the lease of: one it created claimed, or
        one a release handed over (no claim, no history read)."""
        if not self.running or self.draining:
            self._orphans.add(run.id)
            return
        if self._unsettled_write(run.id):  # (its lease expires; any instance takes it then)
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
        """Deliver a cancellation to the activation executing ``run_id`` here, if any."""
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
        backoff = Backoff(self.clock, self.config.rng)
        for tries_left in (2, 1, 0):
            try:
                released = await release(self.owner, self.clock.now())
                break
            except Exception:  # never fatal: the leases expire anyway
                if not tries_left:
                    log.exception("taking back the leases of %s failed", self.owner)
                    return
                await backoff.sleep()
        if released:
            log.info("%s took back %d leased run(s) of its previous run", self.owner, len(released))

    async def _poll_loop(self) -> None:
        cfg = self.config
        names = cfg.registry.names()
        # only runs of a (workflow, version) registered here, where the store can tell
        pairs = cfg.registry.pairs() if claims_by_version(self.store) else None
        # after a failed poll: 50 ms doubling to 1 s (or the poll interval, when shorter)
        backoff = Backoff(self.clock, cfg.rng, min(1.0, cfg.poll_interval or 1.0))
        while self.running:
            self._poke.clear()
            self._rearm.clear()
            self._earliest = None  # the reads below see every commit made before them
            now = self.clock.now()
            try:
                if pairs is not None:
                    due = await cast(ClaimsByVersion, self.store).due_runs(
                        now, cfg.max_concurrency, versions=pairs
                    )
                else:
                    due = await self.store.due_runs(now, cfg.max_concurrency, names)
                self._backlog = len(due) >= cfg.max_concurrency
                for run_id in due:
                    if run_id not in self._active:
                        self.dispatch(run_id)
                # due schedule ticks (``_schedules``; a backlog of runs does not delay them)
                tick = None if cfg.fire_schedules is None else await cfg.fire_schedules(now)
                if len(due) >= cfg.max_concurrency and len(self._active) < cfg.max_concurrency:
                    await asyncio.sleep(0)  # a backlog and free capacity: next batch at once
                    continue
                nxt = await self.next_due(now)
                nxt = tick if tick is not None and (nxt is None or tick < nxt) else nxt
            except Exception:  # the store is unavailable: try again after a short pause
                log.warning("polling the store failed", exc_info=True)
                await self._wait(round(self.clock.now() + backoff.pause(), 6))
                continue
            backoff.reset()
            deadline = now + cfg.poll_interval if cfg.poll_interval is not None else None
            if nxt is not None and nxt > now and (deadline is None or nxt < deadline):
                deadline = nxt
            await self._wait(deadline)

    async def next_due(self, now: float) -> float | None:
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
                waits.add(asyncio.ensure_future(self.clock.sleep_until(deadline)))
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if done != {rearm}:
                return

    async def _renew_loop(self) -> None:
        """Every ``lease_ttl / 3``, renew the lease of every run here, each in a task of its
        own bounded by ``lease_ttl / 3``: one stalled store call delays no other renewal."""
        cfg, clock = self.config, self.clock
        while self.running:
            await clock.sleep_until(clock.now() + cfg.lease_ttl / 3)
            if self._next_known is not None and clock.now() >= self._next_known:
                self._make_known()
            for run_id in list(self._active):
                if run_id in self._renewing:
                    continue  # its last renewal is still out (bounded: it ends soon)
                self._renewing.add(run_id)
                task = asyncio.ensure_future(self._renew(run_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _renew(self, run_id: str) -> None:
        cfg, clock = self.config, self.clock
        # (read now: a later activation of the run has its own proof, which this renewal's
        # answer says nothing of)
        proof, act = self._leases.get(run_id), self._active.get(run_id)
        sent = clock.now()
        try:
            run = await bounded(
                clock,
                self.store.renew_lease(run_id, self.owner, sent + cfg.lease_ttl),
                cfg.lease_ttl / 3,
            )
        except Exception:  # keep going: the next renewal may succeed in time
            log.warning("renewing the lease of %s failed", run_id, exc_info=True)
            return
        finally:
            self._renewing.discard(run_id)
        if run is None:
            if proof is not None:
                proof.lose()
            if act is not None:
                act.evict()
            return
        if proof is not None:
            proof.granted(sent)
        if act is not None and run.status is RunStatus.CANCELLING:
            act.request_cancel()

    # -- one activation ----------------------------------------------------------------
    async def _activate(self, run_id: str, claimed: tuple[Run, list[Event]] | None = None) -> None:
        try:
            async with self._sem:
                if self.draining:  # (queued here before the drain: not claimed, or given back)
                    return
                await self._drive.run(run_id, claimed)
        finally:
            self._active.pop(run_id, None)
            self._leases.pop(run_id, None)
            self._settled(run_id, None)  # result() waiters: it left here; look again
            if self.draining and not self._active:
                self._idle.set()
            if self._backlog and self.running:
                # A backlog of due runs (say 10,000 timers due at once) is taken a batch of
                # ``max_concurrency`` at a time: without this poke the next batch waited for
                # the poll interval, and the 10,000th timer fired ~100 s late.
                self._backlog = False
                self.poke()
        if run_id in self._handed_later:
            self._handed_later.discard(run_id)
            self._again.discard(run_id)
            task = asyncio.ensure_future(self._resume_handed(run_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        if run_id in self._again and self.running:
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

    # -- what a drive needs of its worker (``runner.WorkerHooks``) ------------------------------
    def room(self) -> int:
        return self.config.max_concurrency - len(self._active)

    def attach(self, run_id: str, act: Activation) -> None:
        self._active[run_id] = act
        if self.draining:
            act.drain()

    def track(self, run_id: str, proof: LeaseProof) -> None:
        self._leases[run_id] = proof

    def hold(self, run_id: str, unsettled: Awaitable[None]) -> None:
        fut = asyncio.ensure_future(unsettled)
        self._unsettled[run_id] = fut
        fut.add_done_callback(lambda _f: self._settled_write(run_id, fut))

    def _settled_write(self, run_id: str, fut: asyncio.Future[None]) -> None:
        if self._unsettled.get(run_id) is fut:
            del self._unsettled[run_id]
        self.poke()  # (it may be due: the poller finds it)

    def _unsettled_write(self, run_id: str) -> bool:
        """An abandoned write for ``run_id`` may still commit: do not activate it yet (a fresh
        read now could miss a step record that lands later, and run the step again)."""
        fut = self._unsettled.get(run_id)
        return fut is not None and not fut.done()

    def resume(self, run_id: str) -> None:
        """Execute ``run_id`` (leased here, nobody executes it) from a fresh read."""
        if run_id in self._active:
            self._handed_later.add(run_id)
            return
        task = asyncio.ensure_future(self._resume_handed(run_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def again(self, run_id: str) -> None:
        self._again.add(run_id)
