"""Release: notify-on-release after completion, failure and cancel; worker-less clients;
cancellation of waiters and holders; retry claims a slot again (docs/singleton.md, "What
happens when a second start arrives" and "Cancelling and retrying"). The hand-off of a freed
slot is ``test_gate_hand_off.py``'s."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from singleton_kit import LaneIn, assert_gated, events_of, get, holders, inp, make_lane, types

from flowkit import (
    ADMITTED_TAG,
    Engine,
    Run,
    RunStatus,
    Singleton,
    WorkflowCtx,
    WorkflowFailedError,
    workflow,
)
from flowkit.events import RunCompleted
from flowkit.stores import MemoryStore
from flowkit.stores.base import Notify, Update
from flowkit_testing import TestEnv

# -- 6. notify-on-release ----------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
async def test_release_admits_the_oldest_waiter_at_the_same_instant(outcome: str) -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:  # gate_polls=False: only a notify can wake the waiters
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(0.5)
        await env.start("lane", inp("A", "signal"), "w1")
        await env.start("lane", inp("A", "signal"), "w2")
        now = env.clock.now()
        if outcome == "failed":
            lane.fail.add("h")
        if outcome == "cancelled":
            await env.engines[0].cancel("h")
        else:
            await env.engines[0].signal("h", "go")
        await env.settle()  # no virtual time passes
        assert env.clock.now() == now
        assert (await get(env, "h")).status == outcome
        assert await holders(env) == ["w1"]
        (adm,) = await events_of(env, "w1", "singleton_admitted")
        assert adm.at == now
        await assert_gated(env, "w2")
        # the waiter did not need its ~1 s retry timer
        assert lane.entered == ["h", "w1"]


async def test_two_freed_slots_wake_two_waiters() -> None:
    lane = make_lane(limit=2)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h1")
        await env.start("lane", inp("A", "signal"), "h2")
        for rid in ("w1", "w2", "w3"):
            await env.start("lane", inp("A", "signal"), rid)
        assert await holders(env) == ["h1", "h2"]
        now = env.clock.now()
        await env.engines[0].signal("h1", "go")
        await env.engines[0].signal("h2", "go")
        await env.settle()
        assert env.clock.now() == now
        assert await holders(env) == ["w1", "w2"]
        await assert_gated(env, "w3")


async def test_one_release_with_two_free_slots_stamps_two_waiters_due_now() -> None:
    store = MemoryStore()
    t0 = 1000.0

    def run(rid: str, status: RunStatus, tags: tuple[str, ...], **kw: float) -> Run:
        return Run(
            id=rid,
            workflow="lane",
            workflow_version="1",
            status=status,
            input=None,
            tags=tags,
            created_at=t0,
            singleton_key="A",
            **kw,
        )

    tag = "singleton:A"
    await store.create_run(run("h", RunStatus.RUNNING, (tag, ADMITTED_TAG)), [])
    for rid in ("w1", "w2", "w3"):
        await store.create_run(run(rid, RunStatus.SUSPENDED, (tag,), wake_at=t0 + 1), [])
    now = t0 + 0.25
    res = await store.commit(
        "h",
        None,
        now,
        Update(
            events=[RunCompleted(at=now)],
            status=RunStatus.COMPLETED,
            notify=Notify("lane", tag, 2),
        ),
    )
    assert res.woken == ("w1", "w2")
    assert ADMITTED_TAG not in res.run.tags
    for rid in ("w1", "w2"):
        assert (await store.get_run(rid)).wake_at == now
    assert (await store.get_run("w3")).wake_at == t0 + 1
    assert set(await store.due_runs(now, 10)) == {"w1", "w2"}


class SpyStore(MemoryStore):
    """Records, after every commit that carries a notify, the woken waiters' wake times and
    the waiters the release handed its slot to (admitted and leased in the same commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.notified: list[tuple[float, dict[str, float | None], list[str]]] = []

    async def commit(self, run_id, owner, now, update):  # type: ignore[no-untyped-def]
        res = await super().commit(run_id, owner, now, update)
        if update.notify is not None:
            stamps = {w: (await self.get_run(w)).wake_at for w in res.woken}
            self.notified.append((now, stamps, [h.run.id for h in res.handed]))
        return res


async def test_worker_less_client_cancelling_a_holder_leaves_the_waiter_due_now() -> None:
    lane = make_lane()
    store = SpyStore()
    async with TestEnv([lane], store=store) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A", "signal"), "w")
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        now = env.clock.now()
        cancelled = await client.cancel("h")
        assert cancelled.status is RunStatus.CANCELLING
        assert ADMITTED_TAG in (await get(env, "h")).tags  # holds until it settles
        await assert_gated(env, "w")

        await env.advance(0)  # a worker polls (no time passes)
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        # the settling commit handed the slot to the waiter, atomically with the release
        (at, stamps, handed) = store.notified[-1]
        assert at == now
        assert (stamps, handed) == ({}, ["w"])
        assert await holders(env) == ["w"]
        (adm,) = await events_of(env, "w", "singleton_admitted")
        assert adm.at == now


async def test_run_until_idle_picks_up_a_client_cancel() -> None:
    """Regression: run_until_idle() used not to poke the workers, so a holder cancelled by a
    worker-less client stayed ``cancelling`` and its waiter never moved."""
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A", "signal"), "w")
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        now = env.clock.now()
        await client.cancel("h")
        await env.run_until_idle()
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        assert await holders(env) == ["w"]
        assert env.clock.now() == now


@workflow(name="fickle2", singleton=Singleton(key=lambda i: i.key, limit=2))
class Fickle2:
    """limit=2; flipping ``variant`` makes replay of a holder diverge (it gets blocked)."""

    def __init__(self) -> None:
        self.variant = "a"

    def a(self) -> str:
        return "a"

    def b(self) -> str:
        return "b"

    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        await ctx.step(self.a if self.variant == "a" else self.b)
        return await ctx.wait_for_signal("go")


async def test_admin_client_without_the_workflow_still_notifies_on_release() -> None:
    wf = Fickle2()
    async with TestEnv([wf]) as env:
        await env.start("fickle2", inp("A"), "h1")
        await env.start("fickle2", inp("A"), "h2")
        await env.start("fickle2", inp("A"), "w")
        wf.variant = "b"
        await env.signal("h1", "go")  # h1's replay diverges: blocked, still holding
        wf.variant = "a"
        assert (await get(env, "h1")).status is RunStatus.BLOCKED
        assert await holders(env, "fickle2") == ["h1", "h2"]

        admin = Engine(env.store, clock=env.clock, worker=False)  # registers no workflow
        now = env.clock.now()
        await admin.cancel("h1")  # a blocked run settles directly, releasing its slot
        assert (await get(env, "h1")).status is RunStatus.CANCELLED
        w = await get(env, "w")
        assert w.wake_at is not None and w.wake_at <= now  # stamped due now by the release
        await env.advance(0)
        assert await holders(env, "fickle2") == ["h2", "w"]


# -- 7. cancellation ----------------------------------------------------------------------


async def test_cancelled_gated_waiter_settles_without_running_its_body() -> None:
    lane = make_lane()
    async with TestEnv([lane], gate_polls=True) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A"), "w")
        await env.advance(3)
        run = await env.cancel("w")
        assert run.status is RunStatus.CANCELLED
        assert await types(env, "w") == [
            "run_started",
            "singleton_gated",
            "cancel_requested",
            "run_cancelled",
        ]
        await env.advance(3)
        assert lane.body["w"] == 0
        assert await holders(env) == ["h"]
        with pytest.raises(Exception, match="cancelled"):
            await env.engines[0].result("w", timeout=1)
        await env.signal("h", "go")
        assert lane.entered == ["h"]  # the cancelled waiter is never admitted later


@workflow(name="tidy", singleton=Singleton(key=lambda i: i.key))
class Tidy:
    """Waits for "go"; on cancellation runs a cleanup step that waits for ``cleanup_gate``."""

    def __init__(self) -> None:
        self.cleanup_gate = asyncio.Event()
        self.body: Counter[str] = Counter()
        self.cleaned: list[str] = []

    async def cleanup(self, run_id: str) -> str:
        await self.cleanup_gate.wait()
        self.cleaned.append(run_id)
        return "clean"

    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        self.body[ctx.run_id] += 1
        try:
            return await ctx.wait_for_signal("go")
        except asyncio.CancelledError:
            await ctx.step(self.cleanup, ctx.run_id)
            raise


async def test_cancelling_holder_keeps_its_slot_until_cancellation_settles() -> None:
    wf = Tidy()
    async with TestEnv([wf], gate_polls=True, hung_step_after=0) as env:  # (a hung step)
        await env.start("tidy", inp("A"), "h")
        await env.start("tidy", inp("A"), "w")
        await env.cancel("h")
        h = await get(env, "h")
        assert h.status is RunStatus.CANCELLING
        assert ADMITTED_TAG in h.tags
        await env.advance(5)  # cleanup is stuck; the waiter re-checks and is denied
        assert (await get(env, "h")).status is RunStatus.CANCELLING
        assert await holders(env, "tidy") == ["h"]
        await assert_gated(env, "w")
        assert wf.body["w"] == 0

        now = env.clock.now()
        wf.cleanup_gate.set()
        await env.settle()
        assert wf.cleaned == ["h"]
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        assert (await types(env, "h"))[-2:] == ["singleton_released", "run_cancelled"]
        assert await holders(env, "tidy") == ["w"]
        (adm,) = await events_of(env, "w", "singleton_admitted")
        assert adm.at == now


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
async def test_cancel_of_a_settled_run_is_a_noop(outcome: str) -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        if outcome == "failed":
            lane.fail.add("h")
        if outcome == "cancelled":
            await env.cancel("h")
        else:
            await env.signal("h", "go")
        before = await get(env, "h")
        events_before = await types(env, "h")
        await env.start("lane", inp("A", "signal"), "next")
        run = await env.cancel("h")
        assert run.status == outcome
        assert await get(env, "h") == before
        assert await types(env, "h") == events_before
        assert await holders(env) == ["next"]


# -- retry claims a slot again ------------------------------------------------------------


async def test_retried_run_waits_for_a_slot_and_keeps_its_queue_position() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        lane.fail.add("f")
        await env.start("lane", inp("A"), "f")
        assert (await get(env, "f")).status is RunStatus.FAILED
        assert ADMITTED_TAG not in (await get(env, "f")).tags
        await env.advance(1)
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(1)
        await env.start("lane", inp("A"), "w")  # created after "f"
        await assert_gated(env, "w")

        lane.fail.discard("f")
        await env.retry("f")
        f = await get(env, "f")
        assert f.status is RunStatus.SUSPENDED  # the slot is held by "h": it must wait
        assert ADMITTED_TAG not in f.tags
        assert (await types(env, "f"))[-2:] == ["run_retried", "singleton_gated"]
        assert await holders(env) == ["h"]

        await env.signal("h", "go")  # "f" (older) goes before "w"
        assert lane.finished == ["h", "f", "w"]
        assert (await get(env, "f")).status is RunStatus.COMPLETED
        t = await types(env, "f")
        assert t.count("singleton_admitted") == 2
        assert t.count("singleton_released") == 2
        assert t[-2:] == ["singleton_released", "run_completed"]


async def test_retried_run_reclaims_a_free_slot() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        lane.fail.add("f")
        await env.start("lane", inp("A"), "f")
        with pytest.raises(WorkflowFailedError):
            await env.engines[0].result("f", timeout=1)
        lane.fail.discard("f")
        await env.retry("f")
        assert (await get(env, "f")).status is RunStatus.COMPLETED
        t = await types(env, "f")
        assert t[t.index("run_retried") + 1] == "singleton_admitted"
        assert lane.entered == ["f"]  # the completed first step replayed, not re-run
