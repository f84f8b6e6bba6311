"""``max_queue_depth`` back-pressure and ``signal_with_start`` on a busy key (docs/singleton.md,
"Bounding the queue" and "signal_with_start")."""

from __future__ import annotations

import asyncio

import pytest
from singleton_kit import assert_gated, get, holders, inp, make_lane, types

import flowkit
from flowkit import ADMITTED_TAG, RunStatus
from flowkit_testing import TestEnv


async def test_start_beyond_limit_plus_queue_depth_is_rejected_and_writes_nothing() -> None:
    lane = make_lane(limit=1, max_queue_depth=2)
    async with TestEnv([lane]) as env:
        for rid in ("r1", "r2", "r3"):
            await env.start("lane", inp("A", "signal"), rid)
        with pytest.raises(flowkit.SingletonQueueFullError) as info:
            await env.start("lane", inp("A", "signal"), "r4")
        err = info.value
        assert (err.workflow, err.key, err.max_queue_depth) == ("lane", "A", 2)
        assert isinstance(err, flowkit.FlowkitError)
        assert await env.store.get_run("r4") is None
        assert [r.id for r in await env.store.list_runs()] == ["r1", "r2", "r3"]
        assert lane.body["r4"] == 0


async def test_queue_cap_counts_every_active_status_and_is_per_key() -> None:
    lane = make_lane(limit=1, max_queue_depth=1)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "event"), "running")  # running, blocked in a step
        await env.start("lane", inp("A", "signal"), "gated")
        assert (await get(env, "running")).status is RunStatus.RUNNING
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.start("lane", inp("A"), "x")
        await env.engines[0].cancel("running")  # cancelling (not yet settled) still counts
        assert (await get(env, "running")).status is RunStatus.CANCELLING
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.start("lane", inp("A"), "x")
        # another key has its own queue
        await env.start("lane", inp("B", "signal"), "b1")
        await env.start("lane", inp("B", "signal"), "b2")
        assert (await get(env, "running")).status is RunStatus.CANCELLED
        assert await holders(env) == ["b1", "gated"]
        assert await env.store.get_run("x") is None


async def test_idempotent_restart_of_an_existing_run_is_never_rejected() -> None:
    lane = make_lane(limit=1, max_queue_depth=1)
    async with TestEnv([lane]) as env:
        first = await env.start("lane", inp("A", "signal"), "r1")
        await env.start("lane", inp("A", "signal"), "r2")
        again = await env.start("lane", inp("A", "signal"), "r2")
        assert again.id == "r2"
        assert again.created_at == (await get(env, "r2")).created_at
        again1 = await env.start("lane", inp("A", "signal"), "r1")
        assert (again1.id, again1.created_at) == ("r1", first.created_at)
        assert len(await env.store.list_runs()) == 2
        assert (await types(env, "r2")).count("run_started") == 1


@pytest.mark.parametrize(("limit", "depth"), [(1, 2), (2, 3)])
async def test_concurrent_starts_create_exactly_limit_plus_queue_depth_runs(
    limit: int, depth: int
) -> None:
    lane = make_lane(limit=limit, max_queue_depth=depth)
    async with TestEnv([lane], instances=2) as env:
        engines = env.engines
        results = await asyncio.gather(
            *[engines[i % 2].start("lane", inp("A", "signal"), f"c{i:02d}") for i in range(20)],
            return_exceptions=True,
        )
        await env.settle()
        created = [r.id for r in results if not isinstance(r, BaseException)]
        rejected = [r for r in results if isinstance(r, BaseException)]
        assert len(created) == limit + depth
        assert len(rejected) == 20 - limit - depth
        assert all(isinstance(e, flowkit.SingletonQueueFullError) for e in rejected)
        assert sorted(r.id for r in await env.store.list_runs()) == sorted(created)
        assert len(await holders(env)) == limit


async def test_start_is_accepted_again_after_a_slot_frees() -> None:
    lane = make_lane(limit=1, max_queue_depth=2)
    async with TestEnv([lane]) as env:
        for rid in ("r1", "r2", "r3"):
            await env.start("lane", inp("A", "signal"), rid)
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.start("lane", inp("A", "signal"), "r4")
        await env.signal("r1", "go")  # r1 settles, r2 is promoted: backlog is 2 again
        assert await holders(env) == ["r2"]
        run = await env.start("lane", inp("A", "signal"), "r4")
        assert run.id == "r4"
        await assert_gated(env, "r4")
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.start("lane", inp("A", "signal"), "r5")


async def test_gated_waiter_cancelled_frees_queue_room() -> None:
    lane = make_lane(limit=1, max_queue_depth=1)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "r1")
        await env.start("lane", inp("A", "signal"), "r2")
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.start("lane", inp("A", "signal"), "r3")
        await env.cancel("r2")
        await env.start("lane", inp("A", "signal"), "r3")
        await assert_gated(env, "r3")


# -- 9. signal_with_start -----------------------------------------------------------------


async def test_signal_with_start_on_a_busy_key_gates_and_buffers_the_signal() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        run = await env.signal_with_start("lane", inp("A", "signal"), "s1", "go", {"n": 42})
        assert run.id == "s1"
        await assert_gated(env, "s1")
        assert lane.body["s1"] == 0
        assert await env.store.peek_signal("s1", "go") is not None  # buffered, not lost
        assert "signal_received" not in await types(env, "s1")

        await env.signal("h", "go", "for-h")
        assert await env.engines[0].result("h", timeout=1) == "for-h"
        # s1 was admitted, reached its wait and consumed the buffered signal
        assert (await get(env, "s1")).status is RunStatus.COMPLETED
        assert await env.engines[0].result("s1", timeout=1) == {"n": 42}
        t = await types(env, "s1")
        assert t.index("singleton_admitted") < t.index("signal_received")
        assert await env.store.peek_signal("s1", "go") is None


async def test_signal_with_start_of_an_existing_gated_run_only_signals() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A", "signal"), "s1")
        await env.signal_with_start("lane", inp("A", "signal"), "s1", "go", 7)
        assert len(await env.store.list_runs()) == 2
        await assert_gated(env, "s1")
        await env.signal("h", "go")
        assert await env.engines[0].result("s1", timeout=1) == 7


async def test_signal_with_start_on_a_full_queue_is_rejected_and_writes_nothing() -> None:
    lane = make_lane(limit=1, max_queue_depth=0)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        with pytest.raises(flowkit.SingletonQueueFullError):
            await env.signal_with_start("lane", inp("A", "signal"), "s1", "go", 1)
        assert await env.store.get_run("s1") is None
        assert [r.id for r in await env.store.list_runs()] == ["h"]
        assert ADMITTED_TAG in (await get(env, "h")).tags
        # the existing run id is never rejected: it is signalled
        await env.signal_with_start("lane", inp("A", "signal"), "h", "go", "hello")
        assert await env.engines[0].result("h", timeout=1) == "hello"
