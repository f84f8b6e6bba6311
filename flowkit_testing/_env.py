"""``TestEnv``: several engine instances on one store, driven by a ``VirtualClock``."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from flowkit import Engine, History, Run, RunStatus
from flowkit._core.limits import duration
from flowkit._core.ready_queue import others_ready
from flowkit._replay.children import wake_signal
from flowkit._worker.children import known_id
from flowkit._worker.settlements import Settlements
from flowkit._worker.step_threads import steps_in_threads
from flowkit.stores import MemoryStore
from flowkit.stores.base import UNSET
from flowkit.stores.schedules import keeps_schedules

from ._clock import DEFAULT_START, VirtualClock
from ._faults import CRASH_SITES, CrashSite, FaultPlan, InstanceStore, Rule

HUNG_STEP_AFTER = 1.0
"""Real seconds time skipping waits for a step attempt in flight before it counts the attempt
as hung and moves virtual time on (``TestEnv(hung_step_after=...)``)."""


class TestEnv:
    """Test environment: ``instances`` engines on ``store`` (a fresh ``MemoryStore`` by default)
    with one ``VirtualClock``; ``settle``/``advance``/``run_until_idle`` drive them."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        workflows: Iterable[Any] = (),
        *,
        instances: int = 1,
        seed: int = 0,
        store: Any = None,
        start: float | datetime = DEFAULT_START,
        lease_ttl: float = 30.0,
        gate_polls: bool = False,
        max_yields: int = 2,
        faults: FaultPlan | None = None,
        retention: float | None = None,
        hung_step_after: float = HUNG_STEP_AFTER,
    ) -> None:
        if instances < 1:
            raise ValueError("instances must be >= 1")
        if (
            isinstance(hung_step_after, bool)
            or not isinstance(hung_step_after, int | float)
            or not hung_step_after >= 0  # (NaN too)
        ):
            raise ValueError(f"hung_step_after takes seconds >= 0, got {hung_step_after!r}")
        self.workflows = list(workflows)
        self.seed = seed
        self.rng = random.Random(seed)
        self.store = store if store is not None else MemoryStore()
        self.clock = VirtualClock(start)
        self.lease_ttl = lease_ttl
        self.gate_polls = gate_polls
        # before each store call an instance yields 0..max_yields times, as the seed decides
        self.max_yields = max_yields
        self.fault_plan = faults
        self.retention = retention  # (``Engine(retention=...)`` of every instance)
        # time skipping waits this many real seconds for a step attempt in flight, then counts
        # it as hung (``_hold``); when it first found each attempt running (``loop.time()``)
        self.hung_step_after = float(hung_step_after)
        self._in_flight_since: dict[object, float] = {}
        self.rules: list[Rule] = []
        self.fired: list[tuple[int, str, str, str, str | None]] = []
        self._pending: set[asyncio.Task[Any]] = set()
        self.bus = Settlements()
        self._n = instances
        self._gen = [0] * instances
        self._proxies: list[InstanceStore] = []
        self._inlined: list[Any] = []
        self.engines: list[Engine] = []

    # -- lifecycle ---------------------------------------------------------------------
    def _make(self, i: int) -> Engine:
        proxy = InstanceStore(self.store, i, self)
        eng = Engine(
            proxy,
            self.workflows,
            clock=self.clock,
            instance_id=f"instance-{i}" + (f".{self._gen[i]}" if self._gen[i] else ""),
            rng=random.Random(f"{self.seed}:{i}:{self._gen[i]}"),
            lease_ttl=self.lease_ttl,
            poll_interval=None,
            bus=self.bus,
            retention=self.retention,
        )
        # the loop waits for each sync step's thread: the seed decides every interleaving
        eng.config.wait_for_step_threads = True
        # time skipping does not jump to a wake time that is only a fallback look
        eng.config.note_poll_wakes = True
        if i < len(self.engines):
            self._proxies[i] = proxy
            self.engines[i] = eng
        else:
            self._proxies.append(proxy)
            self.engines.append(eng)
        return eng

    async def __aenter__(self) -> TestEnv:
        # A group-committing store (SqlStore) makes a write wait for the writes that could join
        # it: calls then yield to the event loop, and the seed no longer decides the order.
        # The environment runs every write at once instead, and restores the setting on exit.
        self._inlined = _inline_writes(self.store)
        try:
            for i in range(self._n):
                await self._make(i).start_worker()
            await self.settle()
        except BaseException:
            for s in self._inlined:
                s.group_commit = True
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for i, eng in enumerate(self.engines):
                if not self._proxies[i].crashed:
                    await eng.stop()
        finally:
            for s in self._inlined:
                s.group_commit = True

    async def crash(self, i: int) -> None:
        """Kill instance ``i`` mid-flight: no cleanup, no lease release; its leases expire."""
        self._proxies[i].crashed = True
        await self._finish_crash(i)
        await self.settle()

    async def _finish_crash(self, i: int) -> None:
        await self.engines[i].crash()

    def _crash_soon(self, i: int) -> None:
        """A crash rule fired inside instance ``i``'s own task: tear it down from outside."""
        task = asyncio.ensure_future(self._finish_crash(i))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def crash_at(self, i: int, point: str, *, match: Any = None, times: int | None = 1) -> Rule:
        """Crash instance ``i`` at a named point (see ``CRASH_SITES``): e.g.
        ``"before_step_record"`` (a step's result computed, not recorded) or
        ``"after_step_record"``. ``match(args, kwargs)`` narrows it further; it sees the
        arguments of whichever store call the point fires at (``"after_admission"``:
        ``try_admit_singleton(run_id, ...)`` or ``create_run(run, events, admission=...)``)."""
        if point not in CRASH_SITES:
            raise ValueError(f"unknown crash point {point!r}; one of {sorted(CRASH_SITES)}")

        def narrowed(site: CrashSite) -> CrashSite:
            base = site.match

            def both(args: Any, kwargs: Any) -> bool:
                return base(args, kwargs) and (match is None or bool(match(args, kwargs)))

            return CrashSite(site.op, site.phase, both, site.result)

        first, *more = (narrowed(s) for s in CRASH_SITES[point])
        assert first.result is None  # a point's first site is a plain (op, phase, match)
        rule = Rule(
            first.op,
            "crash",
            first.phase,
            instance=i,
            times=times,
            match=first.match,
            also=tuple(more),
        )
        self.rules.append(rule)
        return rule

    def inject(self, rule: Rule) -> Rule:
        """Add a fault (or crash) rule at the store seam."""
        self.rules.append(rule)
        return rule

    @property
    def crashed(self) -> list[int]:
        """Indexes of the instances that are down."""
        return [i for i, p in enumerate(self._proxies) if p.crashed]

    async def restart(self, i: int) -> None:
        """Bring instance ``i`` back with a fresh worker on the same store."""
        if not self._proxies[i].crashed:
            await self.crash(i)
        self._gen[i] += 1
        await self._make(i).start_worker()
        await self.settle()

    # -- driving -----------------------------------------------------------------------
    async def settle(self, max_rounds: int = 100_000) -> None:
        """Return once every task is blocked (like trio's ``wait_all_tasks_blocked``);
        virtual time stands still. A step awaiting something outside counts as blocked; a
        sync step running in a step thread counts as running (it is waited for, in real
        time), as it would on the event loop: virtual time never moves while one runs."""
        loop = asyncio.get_running_loop()
        quiet = 0
        for _ in range(max_rounds):
            await asyncio.sleep(0)
            if _nothing_ready(loop):
                quiet += 1
                if quiet >= 3:
                    busy = steps_in_threads()
                    if not busy:
                        return
                    await asyncio.wait(busy, return_when=asyncio.FIRST_COMPLETED)
                    quiet = 0
            else:
                quiet = 0
        raise RuntimeError("settle(): tasks kept running; is a workflow busy-looping?")

    def _poke(self) -> None:
        for eng, proxy in zip(self.engines, self._proxies, strict=True):
            if not proxy.crashed:
                eng.poke()

    async def _next_schedule(self) -> float | None:
        """The next tick of a durable schedule (``engine.schedules``) after now, if any."""
        if not keeps_schedules(self.store):
            return None
        at: float | None = await self.store.next_schedule_after(self.clock.now())
        return at

    async def _next_time(self) -> float | None:
        """The next instant at which some run becomes claimable (wake time, or the lease
        expiry of a crashed instance). Gate re-checks of singleton waiters are skipped unless
        ``gate_polls``: notify-on-release wakes them, so a month-long hold costs no jumps.

        This is the environment's own time-skipping rule, over every instance at once: a
        store's ``next_due_after`` cannot leave out a lease that another live instance renews
        (``Engine.executing``), blocked runs or parked waiters."""
        now = self.clock.now()
        live = {
            e.instance_id: e
            for e, p in zip(self.engines, self._proxies, strict=True)
            if not p.crashed
        }
        best: float | None = None
        active = [st for st in RunStatus if not st.terminal]
        # (only the active runs, status by status: settled runs pile up over a long test)
        for r in [r for st in active for r in await self.store.list_runs(status=st)]:
            if r.lease_owner is not None and r.lease_expires is not None:
                owner = live.get(r.lease_owner)
                if owner is not None and owner.executing(r.id):
                    continue  # renewed by a live activation: its expiry is not a due time
                t: float | None = r.lease_expires
            elif r.status is RunStatus.BLOCKED or (
                not self.gate_polls
                and r.status is RunStatus.SUSPENDED
                and r.singleton_key is not None
                and not r.admitted
            ):
                # blocked runs re-check only when a test advances time explicitly; at their
                # deadline (``execution_timeout``) they are due whatever the test does
                if r.deadline_at is None:
                    continue
                t = r.deadline_at
            else:
                t = r.wake_at
                if t is not None and t > now and r.status is RunStatus.SUSPENDED:
                    t = await self._firm_wake(r, t, live.values())
            if t is not None and t > now and (best is None or t < best):
                best = t
        for eng in live.values():
            # an activation waiting to try a failed store call again, or for an in-process
            # deadline (a step's timeout): it holds its run's lease meanwhile, so time moves
            # there in steps of a lease renewal period, and the renewals keep it provable
            t = eng.retry_due()
            if t is not None and t > now:
                t = min(t, now + self.lease_ttl / 3)
                if best is None or t < best:
                    best = t
        return best

    async def _firm_wake(self, r: Run, t: float, live: Iterable[Engine]) -> float | None:
        """The time at which the suspended run ``r``, due at ``t``, must be looked at: ``t``,
        unless ``t`` is only a fallback look (a parent looking at an unsettled child again,
        every ``CHILD_POLL`` seconds; ``Engine.poll_wake``), which time skipping does not jump
        to: the child's settlement wakes the parent. Then the earliest time something durable
        is due for ``r`` (``None``: none) -- but ``t`` after all when a child it awaits has
        settled without waking it (a lost wake-up: the look is what finds it)."""
        for eng in live:
            noted = eng.poll_wake(r.id)
            if noted is None or noted[0] != t:
                continue
            for child in await self.store.list_runs(parent_id=r.id):
                if (
                    child.status.terminal
                    and child.continued_as is None
                    and wake_signal(await known_id(self.store, child)) in r.waiting_signals
                ):
                    return t
            return noted[1]
        return t

    async def _hold(self) -> None:
        """Wait, in real time, for the step attempts in flight on the live instances, so
        that virtual time never jumps while a step runs its function (a step's ``timeout=``
        measures the virtual time its attempt took: none, when time stands still). An
        attempt still running ``hung_step_after`` real seconds after time skipping first found
        it running counts as hung: time moves on without it (its timeout can then fire)."""
        loop = asyncio.get_running_loop()
        while True:
            # (the instances live now: a crash rule may fire while a step ends)
            live = [e for e, p in zip(self.engines, self._proxies, strict=True) if not p.crashed]
            running: set[object] = set()
            for eng in live:
                running |= eng.steps_in_flight()
            now = loop.time()
            since = {t: self._in_flight_since.get(t, now) for t in running}
            self._in_flight_since = since  # (those that ended are forgotten)
            waited = [t + self.hung_step_after for t in since.values()]
            until = min((t for t in waited if t > now), default=None)
            if until is None:  # (none in flight, or every one is hung)
                return
            ends = [f for eng in live if (f := eng.step_ended()) is not None]
            timeout = None if until == math.inf else until - now
            await asyncio.wait(ends, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            await self.settle()  # (what the ended step let move runs, up to its next step)

    async def _jump(self, to: float) -> None:
        self.clock.jump(max(to, self.clock.now()))
        self._poke()
        await self.settle()

    async def advance(self, seconds: float | timedelta) -> None:
        """Move virtual time ``seconds`` (or a ``timedelta``) forward, firing due timers and
        the ticks of durable schedules (``engine.schedules``) in order. Time never moves while
        a step attempt runs its function: each jump first waits for those in flight, in real
        time (see ``_hold``: one running ``hung_step_after`` real seconds counts as hung)."""
        target = self.clock.now() + duration("advance", seconds)
        self._poke()  # work made due by others (a client engine, a store) moves first
        await self.settle()
        while True:
            await self._hold()  # (no jump while a step runs)
            nxt = _earliest(await self._next_time(), await self._next_schedule())
            if nxt is None or nxt > target:
                break
            await self._jump(nxt)
        await self._jump(target)

    async def run_until_idle(self, max_jumps: int = 1_000_000) -> None:
        """Time skipping: jump from due time to due time until nothing can move. A step
        attempt in flight can move: each jump first waits for those running their function,
        in real time, as the clock stands still (a step's ``timeout=`` is not reached by a
        jump while it does real I/O); one still running ``hung_step_after`` real seconds
        counts as hung, and time skips on (its timeout fires). A durable schedule's ticks
        do not count as something that can move (it would never be idle): those before the
        last due time fire on the way; ``advance`` fires the later ones."""
        self._poke()
        await self.settle()
        for _ in range(max_jumps):
            await self._hold()  # (no jump while a step runs)
            nxt = await self._next_time()
            if nxt is None:
                return
            # (a schedule's ticks never keep it from idling; one due before then fires first)
            await self._jump(_earliest(nxt, await self._next_schedule()) or nxt)
        raise RuntimeError("run_until_idle(): still moving after max_jumps")

    # -- engine shortcuts (the first live instance) -----------------------------------
    def _client(self) -> Engine:
        for eng, proxy in zip(self.engines, self._proxies, strict=True):
            if not proxy.crashed:
                return eng
        raise RuntimeError("every instance has crashed: restart one first")

    async def start(
        self,
        workflow: Any,
        input: Any = None,
        run_id: str | None = None,
        *,
        tags: Sequence[str] = (),
        version: str | None = None,
        search: Mapping[str, Any] | None = None,
    ) -> Run:
        run = await self._client().start(
            workflow, input, run_id, tags=tags, version=version, search=search
        )
        await self.settle()
        return run

    async def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        await self._client().signal(run_id, name, payload)
        await self.settle()

    async def publish_event(
        self, name: str, payload: Any = None, *, event_id: str | None = None
    ) -> Any:
        """``Engine.publish_event`` on a live instance, then ``settle``."""
        done = await self._client().publish_event(name, payload, event_id=event_id)
        await self.settle()
        return done

    async def signal_with_start(
        self, workflow: Any, input: Any, run_id: str, signal: str, payload: Any = None
    ) -> Run:
        run = await self._client().signal_with_start(workflow, input, run_id, signal, payload)
        await self.settle()
        return run

    async def cancel(self, run_id: str, *, compensate: bool = False) -> Run:
        run = await self._client().cancel(run_id, compensate=compensate)
        await self.settle()
        return run

    async def retry(self, run_id: str, *, input: Any = UNSET) -> Run:
        run = await self._client().retry(run_id, input=input)
        await self.settle()
        return run

    async def result(self, run_id: str) -> Any:
        """Run until idle, then return the run's result (or raise its failure); a run that
        continued as new answers with the last run of its chain (as ``Engine.result``)."""
        await self.run_until_idle()
        return await self._client().result(run_id, timeout=5)

    async def get_run(self, run_id: str) -> Run:
        return await self._client().get_run(run_id)

    async def history(self, run_id: str) -> History:
        return await self._client().history(run_id)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _nothing_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether no callback is ready to run on ``loop`` (a loop that does not say never
    counts as quiet)."""
    return not others_ready(loop)


def _inline_writes(store: Any) -> list[Any]:
    """Turn group commit off on ``store`` and the stores it wraps (``.inner``); return those
    that had it on."""
    changed: list[Any] = []
    seen: set[int] = set()
    while store is not None and id(store) not in seen:
        seen.add(id(store))
        if getattr(store, "group_commit", False) is True:
            store.group_commit = False
            changed.append(store)
        store = getattr(store, "inner", None)
    return changed
