"""Run deadlines (``@workflow(execution_timeout=...)``, docs/deadlines-and-dead-letters.md): a run
still active that long after its start is cancelled (``cancel_requested`` with
``reason="execution_timeout"``) and settles ``cancelled``, whether it is running, sleeping, waiting
for a signal, gated behind a singleton holder or recovered after a crash. The deadline is durable
and fires through the timer machinery: virtual time drives a 30-day deadline in no real time."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit import RunStatus, Singleton, WorkflowCtx, workflow
from flowkit._model.definition import definition_of
from flowkit._model.registry import Registry
from flowkit.stores import MemoryStore, SqlStore
from flowkit_testing import TestEnv

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """MemoryStore, then SqlStore on a real SQLite file."""
    if request.param == "memory":
        yield MemoryStore()
        return
    s = SqlStore(f"sqlite:///{tmp_path / 'deadline.db'}")
    yield s
    s.close()


@workflow(name="timed", execution_timeout=HOUR)
class Timed:
    """``input`` picks where the body is when its hour is up: "step" (a step that hangs),
    "sleep" (a day-long sleep), "signal" (a signal wait with no timeout) or "quick"."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.cleanups: list[str] = []

    async def hang(self) -> str:
        await self.release.wait()
        return "released"

    def cleanup(self, where: str) -> str:
        self.cleanups.append(where)
        return "cleaned"

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        try:
            if input == "step":
                await ctx.step(self.hang)
            elif input == "sleep":
                await ctx.sleep(DAY)
            elif input == "signal":
                await ctx.wait_for_signal("go")
            return "done"
        except asyncio.CancelledError:
            await ctx.step(self.cleanup, input)
            raise


def _reasons(events: Any) -> list[str | None]:
    return [e.reason for e in events if e.type == "cancel_requested"]


async def _expect_timed_out(
    env: TestEnv, run_id: str, t0: float, timeout: float, on: int = 0
) -> None:
    run = await env.get_run(run_id)
    assert run.status is RunStatus.CANCELLED
    hist = await env.history(run_id)
    assert _reasons(hist.events) == ["execution_timeout"]
    request = next(e for e in hist.events if e.type == "cancel_requested")
    assert request.at == pytest.approx(t0 + timeout, abs=1e-6)
    assert hist.events[-1].type == "run_cancelled"
    with pytest.raises(flowkit.RunCancelledError):
        await env.engines[on].result(run_id, timeout=5)


@pytest.mark.parametrize("where", ["step", "sleep", "signal"])
async def test_deadline_cancels_the_body_where_it_is(where: str, store: Any) -> None:
    wf = Timed()
    async with TestEnv(workflows=[wf], store=store, hung_step_after=0) as env:  # (a hung step)
        t0 = env.clock.now()
        run = await env.start("timed", where, f"r-{where}")
        assert run.deadline_at == pytest.approx(t0 + HOUR, abs=1e-6)
        await env.run_until_idle()
        await _expect_timed_out(env, f"r-{where}", t0, HOUR)
        # the body received the cancellation where it waited, and cleaned up
        assert wf.cleanups == [where]
        assert env.clock.now() == pytest.approx(t0 + HOUR, abs=1e-6)


async def test_a_parked_run_is_due_no_later_than_its_deadline(store: Any) -> None:
    async with TestEnv(workflows=[Timed()], store=store) as env:
        t0 = env.clock.now()
        await env.start("timed", "sleep", "s")
        await env.start("timed", "signal", "w")
        for rid in ("s", "w"):
            run = await env.get_run(rid)
            assert run.status is RunStatus.SUSPENDED
            # a day's sleep, a wait without a wake time: both due at the deadline
            assert run.wake_at == pytest.approx(t0 + HOUR, abs=1e-6)


async def test_a_run_that_finishes_in_time_is_not_cancelled(store: Any) -> None:
    async with TestEnv(workflows=[Timed()], store=store) as env:
        await env.start("timed", "signal", "r")
        await env.advance(HOUR / 2)
        await env.signal("r", "go")
        assert await env.result("r") == "done"
        assert _reasons((await env.history("r")).events) == []


@workflow(name="month", execution_timeout=30 * DAY)
class Month:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        for _ in range(100):
            await ctx.sleep(DAY)  # a hundred days of work: the deadline comes first
        return "done"


async def test_virtual_time_drives_a_30_day_deadline(store: Any) -> None:
    async with TestEnv(workflows=[Month()], store=store) as env:
        t0 = env.clock.now()
        await env.start("month", None, "m")
        await env.run_until_idle()
        await _expect_timed_out(env, "m", t0, 30 * DAY)
        timers = [e for e in (await env.history("m")).events if e.type == "timer_fired"]
        assert len(timers) == 29  # the 30th day's timer was cut short by the deadline


async def test_the_deadline_survives_a_crash(store: Any) -> None:
    """A crash (and a restart under a new worker) does not reset the deadline: it is stored
    with the run at its start."""
    wf = Timed()
    # (its step hangs on purpose: time moves on at once, docs/testing.md)
    async with TestEnv(workflows=[wf], store=store, instances=2, hung_step_after=0) as env:
        t0 = env.clock.now()
        await env.start("timed", "step", "c")  # instance 0 runs it; its step hangs
        assert env.engines[0].executing("c")
        await env.advance(HOUR / 2)
        await env.crash(0)
        await env.advance(HOUR / 4)  # the lease expired: instance 1 took the run over
        run = await env.get_run("c")
        assert run.lease_owner == "instance-1" and run.recoveries == 1
        assert run.deadline_at == pytest.approx(t0 + HOUR, abs=1e-6)
        await env.run_until_idle()
        await _expect_timed_out(env, "c", t0, HOUR, on=1)


@workflow(
    name="timed-lane",
    singleton=Singleton(key=lambda _: "lane"),
    execution_timeout=HOUR,
)
class TimedLane:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        self.ran.append(input)
        await ctx.wait_for_signal("go")
        return input


async def test_deadline_cancels_a_run_gated_behind_its_singleton_holder(store: Any) -> None:
    wf = TimedLane()
    async with TestEnv(workflows=[wf], store=store) as env:
        t0 = env.clock.now()
        await env.start("timed-lane", "holder", "h")
        await env.advance(HOUR / 2)
        await env.start("timed-lane", "waiter", "w")  # gated: its deadline is 30 min later
        assert (await env.get_run("w")).status is RunStatus.SUSPENDED
        await env.run_until_idle()
        # the holder's hour was up first: it was cancelled in its signal wait, released the
        # key, and the waiter got the slot, then its own hour ran out in its signal wait
        holder = await env.history("h")
        assert _reasons(holder.events) == ["execution_timeout"]
        assert [e.type for e in holder.events][-2:] == ["singleton_released", "run_cancelled"]
        await _expect_timed_out(env, "w", t0 + HOUR / 2, HOUR)
        assert set(wf.ran) == {"holder", "waiter"}


async def test_deadline_settles_a_still_gated_run_at_once(store: Any) -> None:
    """A waiter whose deadline passes behind its key's holder settles ``cancelled`` without
    ever running its body (no body could receive the cancellation)."""

    @workflow(name="lane2", singleton=Singleton(key=lambda _: "k"), execution_timeout=HOUR)
    class Lane2:
        def __init__(self) -> None:
            self.ran: list[str] = []

        async def run(self, ctx: WorkflowCtx, input: str) -> str:
            self.ran.append(input)
            await ctx.wait_for_signal("go")
            return input

    @workflow(name="holder2", singleton=Singleton(key=lambda _: "k"))
    class Holder2:
        async def run(self, ctx: WorkflowCtx, input: str) -> str:
            await ctx.wait_for_signal("go")
            return input

    wf = Lane2()
    async with TestEnv(workflows=[wf], store=store) as env:
        t0 = env.clock.now()
        await env.start("lane2", "holder", "h")
        await env.start("lane2", "waiter", "w")
        await env.run_until_idle()
        hist = await env.history("w")
        types = [e.type for e in hist.events]
        assert types == ["run_started", "singleton_gated", "cancel_requested", "run_cancelled"]
        assert _reasons(hist.events) == ["execution_timeout"]
        assert hist.events[2].at == pytest.approx(t0 + HOUR, abs=1e-6)
        assert set(wf.ran) == {"holder"}  # the waiter's body never ran


async def test_deadline_settles_a_blocked_run_at_once(store: Any) -> None:
    calls: list[str] = []

    @workflow(name="drift", execution_timeout=HOUR)
    class Drift:
        def a(self) -> str:
            calls.append("a")
            return "a"

        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            await ctx.step(self.a)
            await ctx.sleep(60)
            return "done"

    @workflow(name="drift", execution_timeout=HOUR)
    class Drifted:  # a deploy changed the body: the recorded step is not there any more
        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            await ctx.sleep(60)
            return "done"

    async with TestEnv(workflows=[Drift()], store=store) as env:
        t0 = env.clock.now()
        await env.start("drift", None, "b")
        await env.engines[0].stop()
        deployed = Registry()
        deployed.add(definition_of(Drifted), Drifted())
        env.engines[0].registry = deployed
        await env.engines[0].start_worker()
        await env.advance(61)
        assert (await env.get_run("b")).status is RunStatus.BLOCKED
        await env.run_until_idle()
        hist = await env.history("b")
        assert [e.type for e in hist.events][-2:] == ["cancel_requested", "run_cancelled"]
        assert _reasons(hist.events) == ["execution_timeout"]
        assert hist.events[-1].at == pytest.approx(t0 + HOUR, abs=1e-6)


async def test_retry_gives_a_fresh_deadline(store: Any) -> None:
    @workflow(name="flaky", execution_timeout=HOUR)
    class Flaky:
        def __init__(self) -> None:
            self.fail = True

        def work(self) -> str:
            if self.fail:
                raise RuntimeError("boom")
            return "ok"

        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            await ctx.sleep(HOUR / 2)
            return await ctx.step(self.work)

    wf = Flaky()
    async with TestEnv(workflows=[wf], store=store) as env:
        await env.start("flaky", None, "f")
        await env.run_until_idle()
        assert (await env.get_run("f")).status is RunStatus.FAILED
        await env.advance(2 * HOUR)  # long past the first deadline
        t1 = env.clock.now()
        run = await env.retry("f")
        assert run.deadline_at == pytest.approx(t1 + HOUR, abs=1e-6)
        await env.run_until_idle()
        assert (await env.get_run("f")).status is RunStatus.FAILED  # (the step failed again)
        # a client engine that does not have the workflow: the run's own timeout is kept
        await env.advance(5 * HOUR)
        client = flowkit.Engine(env.store, [], clock=env.clock, worker=False)
        t2 = env.clock.now()
        run = await client.retry("f")
        assert run.deadline_at == pytest.approx(t2 + HOUR, abs=1e-6)
        wf.fail = False
        env.engines[0].poke()
        assert await env.result("f") == "ok"


@pytest.mark.parametrize("bad", [0, -1, float("-inf"), float("nan"), "1", True, 1e300])
def test_bad_execution_timeout_is_refused_at_decoration(bad: Any) -> None:
    with pytest.raises(flowkit.InvalidInputError, match="execution_timeout"):

        @workflow(name="bad", execution_timeout=bad)
        class Bad:
            async def run(self, ctx: WorkflowCtx, input: None) -> None:
                return None


def test_an_infinite_execution_timeout_is_none() -> None:
    """``math.inf`` means what ``None`` means: no deadline (docs/writing-workflows.md)."""

    @workflow(name="endless", execution_timeout=float("inf"))
    class Endless:
        async def run(self, ctx: WorkflowCtx, input: None) -> None:
            return None

    defn = definition_of(Endless)
    assert defn is not None and defn.execution_timeout is None


# -- property: any program under any deadline settles, and its history replays --------------

try:
    from test_replay_property import Kid, _leaves, _ProgramBody, programs
except ImportError:  # tests/ imported as a package
    from tests.test_replay_property import Kid, _leaves, _ProgramBody, programs


async def _check_timed_program(prog: list[Any], timeout: float) -> None:
    timed = workflow(name="timed-program", execution_timeout=timeout)(
        type("TimedProgram", (_ProgramBody,), {})
    )
    wf = timed()
    leaves = _leaves(prog)
    async with TestEnv([wf, Kid()], seed=len(prog)) as env:
        t0 = env.clock.now()
        await env.start("timed-program", prog, "p")
        for sig in (op for op in leaves if op[0] == "signal" and op[2]):
            await env.signal("p", sig[1], f"{sig[1]}-payload")
        await env.run_until_idle()  # a late signal is never sent: only the deadline ends it
        run = await env.get_run("p")
        h = await env.history("p")
        assert [e.seq for e in h] == list(range(1, len(h) + 1))
        assert all(n == 1 for n in wf.execs.values())  # no step ran twice
        requests = [e for e in h.events if e.type == "cancel_requested"]
        if run.status is RunStatus.CANCELLED:
            assert h.types[-1] == "run_cancelled"
            assert [e.reason for e in requests] == ["execution_timeout"]
            assert requests[0].at == pytest.approx(t0 + timeout, abs=1e-6)
        else:
            assert run.status is RunStatus.COMPLETED, (run.status, run.error)
            assert requests == [] and h.events[-1].at <= t0 + timeout
        # its children settled too (cancelled with it, when it was)
        for kid in await env.engines[0].list_runs(parent_id="p"):
            assert kid.status.terminal, (kid.id, kid.status)
        await flowkit.replay_async(h, timed)
        assert flowkit.History.from_json(h.to_json()) == h


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(prog=programs(), timeout=st.sampled_from([0.5, 1, 30, 3600, 1_000_000]))
async def test_random_programs_under_a_deadline_settle_and_replay(
    prog: list[Any], timeout: float
) -> None:
    await _check_timed_program(prog, timeout)


async def test_retry_under_code_without_a_timeout_drops_the_passed_deadline(store: Any) -> None:
    """A fix deployed under the same version without an ``execution_timeout``: a retry after
    the old deadline runs the run, not cancels it at once (the deadline is the code's now)."""

    def boom() -> str:
        raise RuntimeError("bug")

    def fine() -> str:
        return "ok"

    @workflow(name="job", execution_timeout=100)
    class Job:
        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            return await ctx.step(boom, name="work")

    @workflow(name="job")
    class JobFixed:
        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            return await ctx.step(fine, name="work")

    async with TestEnv(workflows=[Job()], store=store) as env:
        await env.start("job", None, "r")
        await env.run_until_idle()
        assert (await env.get_run("r")).status is RunStatus.FAILED
        later = env.clock.now() + 200  # past the old deadline
    async with TestEnv(workflows=[JobFixed()], store=store, start=later) as env:
        retried = await env.retry("r")
        assert retried.deadline_at is None
        assert await env.result("r") == "ok"
        assert _reasons((await env.history("r")).events) == []


async def test_a_users_cancel_landing_as_the_deadline_fires_is_not_doubled(store: Any) -> None:
    """An ``engine.cancel`` that lands between the claim that finds the deadline passed and
    its cancel: one ``cancel_requested`` (the user's), not two."""

    @workflow(name="slow", execution_timeout=60)
    class Slow:
        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            await ctx.sleep(10)
            await ctx.sleep(HOUR)
            return "done"

    armed: list[TestEnv] = []
    load_events = store.load_events

    async def racing_load_events(run_id: str) -> Any:
        if armed:
            env = armed.pop()
            await env.engines[0].cancel(run_id)  # the user cancels now
        return await load_events(run_id)

    store.load_events = racing_load_events
    async with TestEnv(workflows=[Slow()], store=store) as env:
        await env.start("slow", None, "r")
        await env.advance(10)  # parked in the second sleep, due at the deadline
        armed.append(env)
        await env.advance(60)
        await env.run_until_idle()
        assert not armed  # (the race happened)
        events = (await env.history("r")).events
        assert _reasons(events) == [None]
        assert events[-1].type == "run_cancelled"
