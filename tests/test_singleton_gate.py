"""The gate as a workflow sees it: holders keep slots, FIFO by (created_at, id), pending runs,
the reserved marker, parking of denied runs, gate events, holders across suspension, blocking
and crashes (docs/singleton.md, "What happens when a second start arrives"). Admission at
creation is ``test_gate_on_create.py``'s."""

from __future__ import annotations

import asyncio

import pytest
from singleton_kit import (
    JITTER,
    RETRY,
    LaneIn,
    assert_gated,
    events_of,
    get,
    holders,
    inp,
    make_lane,
    spy_admissions,
    types,
)

from flowkit import (
    ADMITTED_TAG,
    Engine,
    RunStatus,
    Singleton,
    WorkflowCtx,
    workflow,
)
from flowkit_testing import TestEnv

# -- 3. holders, FIFO order, pending runs, the reserved marker ----------------------------


async def test_admitted_run_carries_the_reserved_marker() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "r1")
        run = await env.get_run("r1")
        assert ADMITTED_TAG == "flowkit:singleton:admitted"
        assert ADMITTED_TAG in run.tags
        assert run.admitted


async def test_later_start_with_same_instant_and_smaller_id_cannot_displace_holder() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "m")
        await env.start("lane", inp("A", "signal"), "a")  # same created_at, "a" < "m"
        assert (await env.get_run("a")).created_at == (await env.get_run("m")).created_at
        assert await holders(env) == ["m"]
        await assert_gated(env, "a")
        await env.advance(3)
        assert await holders(env) == ["m"]
        assert lane.body["a"] == 0


async def test_free_slots_go_to_waiters_in_created_at_then_code_point_id_order() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "holder")
        start_order = ["é1", "b1", "Z1", "a1", "B1"]  # no time passes between the starts
        for rid in start_order:
            await env.start("lane", inp("A", "signal"), rid)
        created = {(await env.get_run(r)).created_at for r in start_order}
        assert len(created) == 1
        expected = sorted(start_order)  # code point order: "B1" < "Z1" < "a1" < "b1" < "é1"
        assert expected == ["B1", "Z1", "a1", "b1", "é1"]

        admitted = []
        current = "holder"
        for _ in start_order:
            await env.signal(current, "go")
            (current,) = await holders(env)
            admitted.append(current)
        assert admitted == expected
        assert lane.entered == ["holder", *expected]


async def test_older_waiter_is_admitted_before_younger_even_after_time_passes() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(1)
        await env.start("lane", inp("A", "signal"), "z-older")
        await env.advance(1)
        await env.start("lane", inp("A", "signal"), "a-younger")
        await env.signal("h", "go")
        assert await holders(env) == ["z-older"]
        await assert_gated(env, "a-younger")


async def test_pending_run_takes_part_in_waiter_order() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        calls = spy_admissions(env)
        # a worker-less client creates "a": it stays pending until some worker polls
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        await client.start("lane", inp("A", "signal"), "a")
        await env.start("lane", inp("A", "signal"), "b")  # same instant, "b" > "a"
        # "b" was checked first (at its creation), while nothing held the slot: the older
        # pending "a" was ahead of it, so "b" was denied
        op, rid, ok, before = calls[0]
        assert (op, rid, ok) == ("create_run", "b", False)
        assert before["a"].status is RunStatus.PENDING
        assert not any(ADMITTED_TAG in r.tags for r in before.values())
        await env.advance(0)  # whichever way "a" gets picked up, it is admitted first
        assert await holders(env) == ["a"]
        await assert_gated(env, "b")
        await env.signal("a", "go")
        assert await holders(env) == ["b"]


async def test_pending_run_holds_no_slot() -> None:
    lane = make_lane(limit=2)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        calls = spy_admissions(env)
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        await client.start("lane", inp("A", "signal"), "p")  # pending
        await env.start("lane", inp("A", "signal"), "a")  # same instant, "a" < "p"
        # "p" was pending when "a" claimed the second slot (at its creation): a pending run
        # holds nothing
        op, rid, ok, before = calls[0]
        assert (op, rid, ok) == ("create_run", "a", True)
        assert before["p"].status is RunStatus.PENDING
        await env.advance(0)
        assert await holders(env) == ["a", "h"]
        await assert_gated(env, "p")


async def test_user_cannot_set_reserved_or_singleton_tags() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        run = await env.start(
            "lane",
            inp("A", "signal"),
            "w",
            tags=["flowkit:singleton:admitted", "singleton:other", "team:ops"],
        )
        assert run.tags == ("singleton:A", "team:ops")
        stored = await env.get_run("w")
        assert ADMITTED_TAG not in stored.tags
        assert "singleton:other" not in stored.tags
        assert stored.singleton_key == "A"
        await assert_gated(env, "w")  # a forged marker does not admit it
        assert await holders(env) == ["h"]
        first = (await env.history("w"))[0]
        assert ADMITTED_TAG not in first.tags and "singleton:other" not in first.tags


# -- 4. parking, gate events, admission --------------------------------------------------


async def test_denied_run_is_parked_suspended_with_jittered_retry() -> None:
    lane = make_lane()
    async with TestEnv([lane], seed=3) as env:
        await env.start("lane", inp("A", "signal"), "h")
        now = env.clock.now()
        for i in range(6):
            await env.start("lane", inp("A"), f"w{i}")
            run = await env.get_run(f"w{i}")
            assert run.status is RunStatus.SUSPENDED
            assert run.lease_owner is None
            assert run.wake_at is not None
            assert now + RETRY - JITTER <= run.wake_at <= now + RETRY + JITTER
            (gated,) = await events_of(env, f"w{i}", "singleton_gated")
            assert gated.key == "A"
            assert gated.retry_at == run.wake_at


async def test_gated_is_recorded_once_per_episode_and_body_never_runs_while_gated() -> None:
    lane = make_lane()
    store_calls = 0
    async with TestEnv([lane], gate_polls=True) as env:
        real = env.store.try_admit_singleton

        async def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal store_calls
            store_calls += 1
            return await real(*args, **kwargs)

        env.store.try_admit_singleton = counting  # type: ignore[method-assign]
        real_claim = env.store.claim

        async def counting_claims(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal store_calls
            got = await real_claim(*args, **kwargs)
            # (a re-check decided in the claim: ``ClaimsGated``)
            store_calls += got is not None and got.lease_owner is None  # (denied, parked)
            return got

        env.store.claim = counting_claims  # type: ignore[method-assign]
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A"), "w")
        before = store_calls
        await env.advance(6)
        assert store_calls - before >= 4  # the gate re-checked about once a second
        assert (await types(env, "w")) == ["run_started", "singleton_gated"]
        assert lane.body["w"] == 0
        assert lane.entered == ["h"]

        await env.signal("h", "go")
        t = await types(env, "w")
        assert t[:3] == ["run_started", "singleton_gated", "singleton_admitted"]
        assert t.count("singleton_gated") == 1
        assert t.count("singleton_admitted") == 1
        assert t[3] == "step_completed"  # the body starts only after admission
        assert lane.body["w"] == 1


async def test_immediate_admission_records_singleton_admitted_before_the_body() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A"), "r1")
        (adm,) = await events_of(env, "r1", "singleton_admitted")
        assert adm.key == "A"
        assert await types(env, "r1") == [
            "run_started",
            "singleton_admitted",
            "step_completed",
            "step_completed",
            "singleton_released",
            "run_completed",
        ]


async def test_different_keys_do_not_gate_each_other() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "a")
        await env.start("lane", inp("B", "signal"), "b")
        assert await holders(env) == ["a", "b"]


async def test_same_key_in_different_workflows_does_not_gate() -> None:
    one, two = make_lane("one"), make_lane("two")
    async with TestEnv([one, two]) as env:
        await env.start("one", inp("A", "signal"), "r1")
        await env.start("two", inp("A", "signal"), "r2")
        assert await holders(env, "one") == ["r1"]
        assert await holders(env, "two") == ["r2"]


# -- 5. holders keep their slot; terminal settlement releases it --------------------------


@pytest.mark.parametrize("hold", ["sleep", "signal", "event"])
async def test_holder_keeps_slot_while_running_or_suspended(hold: str) -> None:
    lane = make_lane()
    async with TestEnv([lane], gate_polls=True, hung_step_after=0) as env:  # (a hung step)
        await env.start("lane", inp("A", hold, seconds=3600), "h")
        await env.start("lane", inp("A"), "w")
        status = RunStatus.RUNNING if hold == "event" else RunStatus.SUSPENDED
        assert (await env.get_run("h")).status is status
        await env.advance(1800)
        assert (await env.get_run("h")).status is status
        assert await holders(env) == ["h"]
        await assert_gated(env, "w")

        if hold == "sleep":
            await env.advance(1800)
        elif hold == "signal":
            await env.signal("h", "go")
        else:
            lane.gates["h"].set()
            await env.settle()
        assert (await env.get_run("h")).status is RunStatus.COMPLETED
        assert (await env.get_run("w")).status is RunStatus.COMPLETED
        assert lane.entered == ["h", "w"]


@workflow(name="fickle", singleton=Singleton(key=lambda i: i.key))
class Fickle:
    """Its first step's name depends on ``variant``: flipping it makes replay diverge."""

    def __init__(self) -> None:
        self.variant = "a"
        self.body: dict[str, int] = {}

    def a(self) -> str:
        return "a"

    def b(self) -> str:
        return "b"

    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        self.body[ctx.run_id] = self.body.get(ctx.run_id, 0) + 1
        await ctx.step(self.a if self.variant == "a" else self.b)
        return await ctx.wait_for_signal("go")


async def test_blocked_holder_keeps_its_slot() -> None:
    wf = Fickle()
    async with TestEnv([wf], gate_polls=True) as env:
        await env.start("fickle", inp("A"), "h")
        await env.start("fickle", inp("A"), "w")
        wf.variant = "b"  # a bad deploy: replay of "h" diverges
        await env.signal("h", "go", "payload")
        h = await env.get_run("h")
        assert h.status is RunStatus.BLOCKED
        assert h.error is not None and h.error["type"] == "NonDeterminismError"
        assert ADMITTED_TAG in h.tags
        await env.advance(30)  # waiter re-checks meanwhile
        assert await holders(env, "fickle") == ["h"]
        await assert_gated(env, "w")
        assert "w" not in wf.body

        wf.variant = "a"  # fixed: the blocked retry replays cleanly and consumes the signal
        await env.advance(31)
        assert (await env.get_run("h")).status is RunStatus.COMPLETED
        assert await env.engines[0].result("h", timeout=1) == "payload"
        assert await holders(env, "fickle") == ["w"]
        assert (await types(env, "h")).count("singleton_admitted") == 1


async def test_cancelling_a_blocked_holder_releases_its_slot_to_the_waiter() -> None:
    wf = Fickle()
    async with TestEnv([wf]) as env:
        await env.start("fickle", inp("A"), "h")
        await env.start("fickle", inp("A"), "w")
        wf.variant = "b"
        await env.signal("h", "go")
        assert (await get(env, "h")).status is RunStatus.BLOCKED
        now = env.clock.now()
        await env.cancel("h")
        h = await get(env, "h")
        assert h.status is RunStatus.CANCELLED
        assert ADMITTED_TAG not in h.tags
        assert (await types(env, "h"))[-2:] == ["singleton_released", "run_cancelled"]
        assert await holders(env, "fickle") == ["w"]
        (adm,) = await events_of(env, "w", "singleton_admitted")
        assert adm.at == now


async def test_crashed_holder_is_readmitted_without_new_admission_event() -> None:
    lane = make_lane()
    async with TestEnv(
        [lane], instances=2, gate_polls=True, lease_ttl=30, hung_step_after=0
    ) as env:  # (a hung step)
        await env.start("lane", inp("A", "event"), "h")  # runs on instance 0, blocked in a step
        await env.start("lane", inp("A"), "w")
        h = await get(env, "h")
        assert (h.status, h.lease_owner) == (RunStatus.RUNNING, "instance-0")

        await env.crash(0)
        await env.advance(20)  # lease still live: the waiter keeps being denied
        await assert_gated(env, "w")
        assert await holders(env) == ["h"]

        await env.advance(15)  # past the lease: instance 1 recovers the holder
        h = await get(env, "h")
        assert h.lease_owner == "instance-1"
        assert ADMITTED_TAG in h.tags
        assert lane.body["h"] == 2
        assert (await types(env, "h")).count("singleton_admitted") == 1
        await assert_gated(env, "w")

        lane.gates["h"].set()
        await env.settle()
        assert (await get(env, "h")).status is RunStatus.COMPLETED
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        assert lane.body["w"] == 1


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
async def test_terminal_settlement_removes_marker_and_records_release_last(outcome: str) -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        if outcome == "failed":
            lane.fail.add("h")
        if outcome == "cancelled":
            await env.cancel("h")
        else:
            await env.signal("h", "go")
        run = await env.get_run("h")
        assert run.status == outcome
        assert ADMITTED_TAG not in run.tags
        assert "singleton:A" in run.tags
        hist = await env.history("h")
        assert hist.types[-2:] == ["singleton_released", f"run_{outcome}"]
        assert hist.types.count("singleton_released") == 1
        assert hist[-2].key == "A"
        assert hist[-2].at == hist[-1].at
        assert [e.seq for e in hist] == list(range(1, len(hist) + 1))


async def test_holder_in_a_gather_keeps_its_slot_until_every_branch_is_done() -> None:
    @workflow(name="fan", singleton=Singleton(key=lambda i: i.key))
    class Fan:
        def __init__(self) -> None:
            self.gate = asyncio.Event()

        async def slow(self) -> str:
            await self.gate.wait()
            return "slow"

        def fast(self) -> str:
            return "fast"

        async def run(self, ctx: WorkflowCtx, input: LaneIn) -> list[str | None]:
            return await ctx.gather(ctx.step(self.fast), ctx.step(self.slow), ctx.sleep(5))

    wf = Fan()
    async with TestEnv([wf], gate_polls=True, hung_step_after=0) as env:  # (a hung step)
        await env.start("fan", inp("A"), "h")
        await env.start("fan", inp("A"), "w")
        await env.advance(10)
        assert await holders(env, "fan") == ["h"]
        await assert_gated(env, "w")
        wf.gate.set()
        await env.settle()
        assert await env.engines[0].result("h", timeout=1) == ["fast", "slow", None]
        assert await holders(env, "fan") == ["w"]
