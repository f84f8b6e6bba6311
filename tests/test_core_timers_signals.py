"""Durable timers and signals under a VirtualClock, idempotent start, signal_with_start, and
two engine instances sharing one store (exclusive execution, crash takeover)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta

import pytest

import flowkit
from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv

MONTH = 30 * 24 * 3600


@workflow(name="long-sleep")
class LongSleep:
    async def run(self, ctx: WorkflowCtx, input: None) -> list[str]:
        before = ctx.now()
        await ctx.sleep(MONTH)
        return [before.isoformat(), ctx.now().isoformat()]


async def test_month_long_sleep_skips_virtual_time() -> None:
    async with TestEnv([LongSleep()]) as env:
        start = env.clock.now()
        t0 = time.perf_counter()
        await env.start("long-sleep", None, "r1")
        assert (await env.get_run("r1")).wake_at == pytest.approx(start + MONTH)
        await env.run_until_idle()
        elapsed = time.perf_counter() - t0
        assert elapsed < 5.0
        before, after = map(datetime.fromisoformat, await env.result("r1"))
        assert before.timestamp() == pytest.approx(start)
        assert after - before >= timedelta(days=30)
        assert env.clock.now() >= start + MONTH
        h = await env.history("r1")
        assert h.types == ["run_started", "timer_started", "timer_fired", "run_completed"]


@workflow(name="sleeper")
class Sleeper:
    def __init__(self) -> None:
        self.woke: list[tuple[float, float]] = []
        self.clock: flowkit.Clock | None = None

    def mark(self, seconds: float) -> None:
        assert self.clock is not None
        self.woke.append((seconds, self.clock.now()))

    async def run(self, ctx: WorkflowCtx, input: float) -> float:
        await ctx.sleep(input)
        await ctx.step(self.mark, input)
        return input


async def test_advance_fires_only_due_timers() -> None:
    async with TestEnv([Sleeper()]) as env:
        env.workflows[0].clock = env.clock
        await env.start("sleeper", 5, "five")
        await env.start("sleeper", 10, "ten")
        await env.advance(7)
        assert (await env.get_run("five")).status is RunStatus.COMPLETED
        assert (await env.get_run("ten")).status is RunStatus.SUSPENDED
        await env.advance(2.9)
        assert (await env.get_run("ten")).status is RunStatus.SUSPENDED
        await env.advance(0.1)
        assert (await env.get_run("ten")).status is RunStatus.COMPLETED


async def test_advance_fires_timers_in_order_at_their_due_time() -> None:
    wf = Sleeper()
    async with TestEnv([wf]) as env:
        wf.clock = env.clock
        start = env.clock.now()
        for s in (10, 5, 7, 3):
            await env.start("sleeper", s, f"r{s}")
        await env.advance(20)
        assert [s for s, _ in wf.woke] == [3, 5, 7, 10]
        assert [t - start for _, t in wf.woke] == pytest.approx([3, 5, 7, 10])
        assert env.clock.now() == pytest.approx(start + 20)


# -- signals ---------------------------------------------------------------------------------


@workflow(name="waiter")
class Waiter:
    async def run(self, ctx: WorkflowCtx, input: float) -> list[object]:
        await ctx.sleep(input)
        first = await ctx.wait_for_signal("go")
        second = await ctx.wait_for_signal("go")
        return [first, second]


async def test_signal_sent_before_the_wait_is_buffered() -> None:
    async with TestEnv([Waiter()]) as env:
        await env.start("waiter", 10, "r1")
        await env.signal("r1", "go", {"n": 1})
        await env.signal("r1", "go", {"n": 2})
        run = await env.get_run("r1")
        assert run.status is RunStatus.SUSPENDED
        assert "signal_received" not in (await env.history("r1")).types
        await env.advance(10)
        assert await env.result("r1") == [{"n": 1}, {"n": 2}]  # FIFO, none lost


async def test_signal_sent_after_the_wait_wakes_the_run() -> None:
    async with TestEnv([Waiter()]) as env:
        await env.start("waiter", 0, "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        await env.signal("r1", "go", "a")
        run = await env.get_run("r1")
        assert run.status is RunStatus.SUSPENDED
        assert (await env.history("r1")).types.count("signal_received") == 1
        await env.signal("r1", "go", "b")
        # no time passes: the signal itself makes the run due
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert await env.result("r1") == ["a", "b"]


async def test_signal_of_another_name_does_not_wake_the_wait() -> None:
    async with TestEnv([Waiter()]) as env:
        await env.start("waiter", 0, "r1")
        before = await env.history("r1")
        await env.signal("r1", "other", 1)
        await env.advance(3600)
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        assert await env.history("r1") == before
        await env.signal("r1", "go", 1)
        await env.signal("r1", "go", 2)
        assert await env.result("r1") == [1, 2]


@workflow(name="timeout")
class TimeoutWait:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            got = await ctx.wait_for_signal("go", timeout=30)
        except flowkit.SignalTimeout as exc:
            assert isinstance(exc, TimeoutError)
            assert isinstance(exc, asyncio.TimeoutError)
            return "timeout"
        return f"got {got}"


async def test_wait_for_signal_times_out_durably() -> None:
    async with TestEnv([TimeoutWait()]) as env:
        start = env.clock.now()
        await env.start("timeout", None, "r1")
        assert (await env.get_run("r1")).wake_at == pytest.approx(start + 30)
        await env.advance(29.9)
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        await env.advance(0.1)
        assert await env.result("r1") == "timeout"
        h = await env.history("r1")
        timer = next(e for e in h if e.type == "timer_started")
        assert timer.purpose == "signal_timeout"
        assert "timer_fired" in h.types
        assert "signal_received" not in h.types
        await flowkit.replay_async(h, TimeoutWait)


async def test_signal_before_timeout_wins() -> None:
    async with TestEnv([TimeoutWait()]) as env:
        await env.start("timeout", None, "r1")
        await env.advance(20)
        await env.signal("r1", "go", 7)
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert await env.result("r1") == "got 7"
        await env.advance(60)
        assert "timer_fired" not in (await env.history("r1")).types


@workflow(name="busy-waiter")
class BusyWaiter:
    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def blocked(self) -> str:
        await self.gate.wait()
        return "stepped"

    async def run(self, ctx: WorkflowCtx, input: None) -> list[str]:
        return await ctx.gather(ctx.step(self.blocked), ctx.wait_for_signal("go"))


async def test_signal_delivered_while_running_is_not_lost() -> None:
    wf = BusyWaiter()
    async with TestEnv([wf]) as env:
        await env.start("busy-waiter", None, "r1")
        assert (await env.get_run("r1")).status is RunStatus.RUNNING
        await env.signal("r1", "go", "payload")
        wf.gate.set()
        await env.run_until_idle()
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert await env.engines[0].result("r1", timeout=5) == ["stepped", "payload"]


# -- idempotent start and signal_with_start --------------------------------------------------


@workflow(name="counter")
class CountStarts:
    def __init__(self) -> None:
        self.calls = 0

    def once(self, x: int) -> int:
        self.calls += 1
        return x

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        v = await ctx.step(self.once, input)
        await ctx.sleep(10)
        return v


async def test_start_is_idempotent_by_run_id() -> None:
    wf = CountStarts()
    async with TestEnv([wf]) as env:
        first = await env.start("counter", 1, "r1")
        again = await env.start("counter", 2, "r1")
        assert again.id == "r1"
        assert again.input == first.input == 1
        assert again.created_at == first.created_at
        assert len(await env.engines[0].list_runs()) == 1
        assert (await env.history("r1")).types.count("run_started") == 1
        assert await env.result("r1") == 1
        done = await env.start("counter", 3, "r1")
        assert done.status is RunStatus.COMPLETED
        assert wf.calls == 1
        assert len(await env.history("r1")) == 5


async def test_signal_with_start_creates_then_signals_existing() -> None:
    async with TestEnv([Waiter()]) as env:
        run = await env.signal_with_start("waiter", 0, "r1", "go", "p1")
        assert run.id == "r1"
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        assert (await env.history("r1")).types.count("signal_received") == 1
        again = await env.signal_with_start("waiter", 99, "r1", "go", "p2")
        assert again.input == 0
        assert await env.result("r1") == ["p1", "p2"]
        assert len(await env.engines[0].list_runs()) == 1


# -- two instances on one store -------------------------------------------------------------


@workflow(name="exclusive")
class Exclusive:
    def __init__(self) -> None:
        self.active: Counter[str] = Counter()
        self.max_active: Counter[str] = Counter()
        self.execs: Counter[tuple[str, int]] = Counter()
        self.owners: set[str] = set()
        self.store: object = None
        self.gate: asyncio.Event | None = None

    async def work(self, run_id: str, i: int) -> int:
        self.execs[(run_id, i)] += 1
        self.active[run_id] += 1
        self.max_active[run_id] = max(self.max_active[run_id], self.active[run_id])
        try:
            run = await self.store.get_run(run_id)  # type: ignore[attr-defined]
            self.owners.add(run.lease_owner)
            if i == 1 and self.gate is not None:
                await self.gate.wait()
            for _ in range(5):
                await asyncio.sleep(0)
        finally:
            self.active[run_id] -= 1
        return i

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        total = 0
        for i in range(3):
            total += await ctx.step(self.work, ctx.run_id, i)
            await ctx.sleep(input + i)
        return total


async def test_two_instances_never_execute_one_run_concurrently() -> None:
    wf = Exclusive()
    async with TestEnv([wf], instances=2, seed=3) as env:
        wf.store = env.store
        ids = [f"r{i}" for i in range(24)]
        for n, rid in enumerate(ids):
            await env.engines[n % 2].start("exclusive", n % 4, rid)
        await env.settle()
        await env.run_until_idle()
        for rid in ids:
            assert await env.engines[1].result(rid, timeout=5) == 3
        assert set(wf.max_active.values()) == {1}
        assert wf.execs == {(rid, i): 1 for rid in ids for i in range(3)}
        assert wf.owners == {"instance-0", "instance-1"}
        for rid in ids:
            h = await env.history(rid)
            assert [e.seq for e in h] == list(range(1, len(h) + 1))


async def test_crashed_instance_run_is_taken_over_after_lease_expiry() -> None:
    wf = Exclusive()
    wf.gate = asyncio.Event()
    async with TestEnv([wf], instances=2, lease_ttl=30) as env:
        wf.store = env.store
        await env.engines[1].start("exclusive", 0, "r1")
        await env.settle()  # step 0 done, sleep(0) fired; step 1 now blocks on the gate
        assert wf.execs == {("r1", 0): 1, ("r1", 1): 1}
        run = await env.get_run("r1")
        assert run.status is RunStatus.RUNNING and run.lease_owner == "instance-1"

        await env.crash(1)
        wf.gate.set()
        await env.advance(29)
        run = await env.get_run("r1")
        assert run.status is RunStatus.RUNNING and run.lease_owner == "instance-1"
        assert wf.execs[("r1", 1)] == 1
        await env.advance(2)  # past lease_ttl: instance 0 takes over
        assert await env.result("r1") == 3
        # at-least-once for the interrupted step; completed steps are not re-executed
        assert wf.execs == {("r1", 0): 1, ("r1", 1): 2, ("r1", 2): 1}
        assert wf.owners == {"instance-0", "instance-1"}
        h = await env.history("r1")
        assert h.types.count("step_completed") == 3
        assert [e.seq for e in h] == list(range(1, len(h) + 1))
        await flowkit.replay_async(h, Exclusive)


async def _two_instance_histories(seed: int) -> list[str]:
    wf = Exclusive()
    async with TestEnv([wf], instances=2, seed=seed) as env:
        wf.store = env.store
        for n in range(6):
            await env.engines[n % 2].start("exclusive", n % 3, f"r{n}")
        await env.run_until_idle()
        return [(await env.history(f"r{n}")).to_json() for n in range(6)]


async def test_same_seed_gives_byte_identical_histories() -> None:
    first = await _two_instance_histories(11)
    again = await _two_instance_histories(11)
    assert first == again
    assert all('"run_completed"' in h for h in first)


@workflow(name="short-nap")
class ShortNap:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        await ctx.sleep(0.05)
        return "rested"


async def test_a_timer_set_here_wakes_the_poller_without_a_store_read() -> None:
    """A run that parks with a future wake time lowers this instance's poll deadline
    locally: the poller reads the store again when the timer is due (here far before its
    60 s poll interval), not once more right after the park."""
    from flowkit.stores import MemoryStore

    class Counting(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.calls: Counter[str] = Counter()

        async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
            self.calls["next_due_at"] += 1
            return await super().next_due_at(exclude_lease_owners)

        async def next_due_after(
            self, now: float, exclude_lease_owners: Sequence[str] = ()
        ) -> float | None:
            self.calls["next_due_after"] += 1
            return await super().next_due_after(now, exclude_lease_owners)

    store = Counting()
    engine = flowkit.Engine(store, [ShortNap()], clock=flowkit.SystemClock(), poll_interval=60)
    async with engine:
        await engine.start(ShortNap, None, "nap")
        assert await engine.result("nap", timeout=10) == "rested"
    # the poller's first pass, and one when the timer fired (none when the run parked); it
    # asks for the next instant after now (next_due_after), not for the earliest of all
    assert store.calls == {"next_due_after": 2}
