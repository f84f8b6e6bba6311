"""The simulation harness: named crash points, injected faults, and seeds that decide
interleavings (the same seed gives byte-identical histories)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sim_kit import start_on_a_live_instance

from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit.stores import SqlStore
from flowkit.stores.base import Update
from flowkit_testing import FaultPlan, InjectedFault, Rule, TestEnv


@workflow(name="three-steps")
class ThreeSteps:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def work(self, run_id: str, name: str) -> str:
        self.calls[(run_id, name)] += 1
        return name

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        a = await ctx.step(self.work, ctx.run_id, "a")
        b = await ctx.step(self.work, ctx.run_id, "b")
        c = await ctx.step(self.work, ctx.run_id, "c")
        return a + b + c


def _step_named(name: str):  # type: ignore[no-untyped-def]
    def match(args, kwargs) -> bool:  # type: ignore[no-untyped-def]
        # a step's record: append_events(run_id, owner, now, events), or a commit's Update
        events = args[3].events if isinstance(args[3], Update) else args[3]
        return any(getattr(e, "result", None) == name for e in events)

    return match


async def test_crash_before_step_record_reruns_only_that_step() -> None:
    wf = ThreeSteps()
    async with TestEnv([wf], instances=2) as env:
        env.crash_at(0, "before_step_record", match=_step_named("b"))
        await env.start("three-steps", None, "r1")
        assert env.crashed == [0]
        assert (await env.get_run("r1")).status is RunStatus.RUNNING
        assert await env.result("r1") == "abc"  # instance 1 recovers after the lease
    assert wf.calls == {("r1", "a"): 1, ("r1", "b"): 2, ("r1", "c"): 1}


async def test_crash_after_step_record_does_not_rerun_it() -> None:
    wf = ThreeSteps()
    async with TestEnv([wf], instances=2) as env:
        env.crash_at(0, "after_step_record", match=_step_named("b"))
        await env.start("three-steps", None, "r1")
        assert env.crashed == [0]
        assert await env.result("r1") == "abc"
        h = await env.history("r1")
    assert wf.calls == {("r1", "a"): 1, ("r1", "b"): 1, ("r1", "c"): 1}
    assert h.types.count("step_completed") == 3


@pytest.mark.parametrize("phase", ["before", "after"])
async def test_a_failing_step_record_is_recovered(phase: str) -> None:
    wf = ThreeSteps()
    async with TestEnv([wf]) as env:
        env.inject(Rule("append_events", "fault", phase, match=_step_named("a")))  # type: ignore[arg-type]
        await env.start("three-steps", None, "r1")
        assert [f[:4] for f in env.fired] == [(0, "append_events", phase, "fault")]
        assert await env.result("r1") == "abc"
    # before: not recorded, so step a runs again; after: recorded, so it does not
    assert wf.calls[("r1", "a")] == (2 if phase == "before" else 1)
    assert wf.calls[("r1", "b")] == 1


async def test_failing_start_writes_nothing_or_is_idempotent() -> None:
    async with TestEnv([ThreeSteps()]) as env:
        env.inject(Rule("create_run", "fault", "before"))
        with pytest.raises(InjectedFault):
            await env.start("three-steps", None, "r1")
        assert await env.store.get_run("r1") is None
        env.inject(Rule("create_run", "fault", "after"))
        with pytest.raises(InjectedFault):
            await env.start("three-steps", None, "r2")
        assert await env.store.get_run("r2") is not None  # written; the caller saw an error
        again = await env.start("three-steps", None, "r2")  # the retry is idempotent
        assert again.id == "r2"
        assert await env.result("r2") == "abc"


async def _history_dump(
    seed: int, faults: float = 0.0, store: object = None
) -> tuple[list[str], list[str]]:
    wf = ThreeSteps()
    order: list[str] = []
    wf_work = wf.work

    def traced(run_id: str, name: str) -> str:
        order.append(f"{run_id}:{name}")
        return wf_work(run_id, name)

    wf.work = traced  # type: ignore[method-assign]
    plan = FaultPlan(rate=faults)
    async with TestEnv([wf], instances=3, seed=seed, faults=plan, store=store) as env:
        for i in range(12):
            for _ in range(5):  # a failed start is retried with the same id
                try:
                    await env.engines[i % 3].start("three-steps", None, f"r{i:02d}")
                    break
                except InjectedFault:
                    continue
        await env.run_until_idle()
        dumps = [(await env.history(f"r{i:02d}")).to_json() for i in range(12)]
    return dumps, order


async def test_same_seed_same_histories_and_side_effects() -> None:
    first = await _history_dump(seed=11, faults=0.05)
    second = await _history_dump(seed=11, faults=0.05)
    assert first == second


async def test_different_seeds_explore_different_interleavings() -> None:
    orders = {tuple((await _history_dump(seed=s))[1]) for s in range(6)}
    assert len(orders) > 1


async def test_same_seed_same_histories_on_a_sqlite_file(tmp_path: Path) -> None:
    runs = []
    for attempt in range(2):
        store = SqlStore(f"sqlite:///{tmp_path / f'sim{attempt}.db'}")
        runs.append(await _history_dump(seed=5, faults=0.05, store=store))
    assert runs[0] == runs[1]
    assert runs[0] == await _history_dump(seed=5, faults=0.05)  # and equal to MemoryStore


async def test_seeded_crash_plan_kills_at_crash_points_and_recovery_finishes() -> None:
    wf = ThreeSteps()
    plan = FaultPlan(crash_rate=0.3, crash_points=("before_step_record", "after_step_record"))
    async with TestEnv([wf], instances=3, seed=3, faults=plan) as env:
        for i in range(6):
            await start_on_a_live_instance(env, "three-steps", None, f"r{i}")
        crashes = [f for f in env.fired if f[3] == "crash"]
        assert crashes, "the seed should have crashed some instance"
        env.fault_plan = None
        for j in list(env.crashed):
            await env.restart(j)
        await env.run_until_idle()
        for i in range(6):
            assert await env.engines[0].result(f"r{i}", timeout=5) == "abc"
    # a run re-executes at most one step per crash: the one computed but not yet durable
    for i in range(6):
        extra = sum(wf.calls[(f"r{i}", n)] for n in "abc") - 3
        assert 0 <= extra <= len(crashes), (i, extra)
    assert all(wf.calls[(f"r{i}", n)] >= 1 for i in range(6) for n in "abc")


@workflow(name="sim-kid")
class SimKid:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        await ctx.sleep(1)
        return input * 2


@workflow(name="sim-parent")
class SimParent:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        a = await ctx.child(SimKid, input)
        h = await ctx.start_child(SimKid, input + 1)
        return int(a) + int(await h.result())


async def _children_under_crashes(seed: int) -> list[str]:
    """Parents whose instances die around their children's start (seeded): every parent
    completes, with exactly its two children, each started once."""
    plan = FaultPlan(
        crash_rate=0.3,
        crash_points=("before_child_create", "after_child_create", "before_child_record"),
    )
    async with TestEnv([SimParent(), SimKid()], instances=3, seed=seed, faults=plan) as env:
        for i in range(6):
            await start_on_a_live_instance(env, "sim-parent", i, f"p{i}")
            await env.settle()
        crashes = [f for f in env.fired if f[3] == "crash"]
        assert crashes, "the seed should have crashed some instance"
        env.fault_plan = None
        for j in list(env.crashed):
            await env.restart(j)
        await env.run_until_idle()
        dumps = []
        for i in range(6):
            assert await env.engines[0].result(f"p{i}", timeout=5) == 4 * i + 2
            kids = await env.engines[0].list_runs(parent_id=f"p{i}")
            assert [k.id for k in kids] == [f"p{i}.child.1", f"p{i}.child.2"]
            for k in kids:
                assert (await env.history(k.id)).types.count("run_started") == 1
            h = await env.history(f"p{i}")
            assert h.types.count("child_started") == 2
            dumps.append(h.to_json())
        return dumps


async def test_crashes_around_the_child_start_never_start_two_children_nor_lose_one() -> None:
    first = await _children_under_crashes(seed=4)
    assert first == await _children_under_crashes(seed=4)  # the same seed, the same histories
