"""Child workflows (docs/composing-workflows.md "Children"): ``ctx.child``, ``ctx.start_child`` with
``ChildHandle.result()``, deterministic ids, the parent woken by its child's settlement, a
child that cannot start, cancellation of a parent's children, crashes around the child's
start; on MemoryStore, a SQLite file and PostgreSQL (``backend``)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from store_kit import Backend

from flowkit import (
    ChildHandle,
    ChildWorkflowError,
    NonDeterminismError,
    RetryPolicy,
    RunCancelledError,
    RunNotFoundError,
    RunStatus,
    Singleton,
    WorkflowCtx,
    replay_async,
    workflow,
)
from flowkit._replay.children import CHILD_POLL
from flowkit_testing import Rule, TestEnv


class Order(BaseModel):
    amount: int


class Receipt(BaseModel):
    charged: int


@workflow(name="payment")
class Payment:
    async def run(self, ctx: WorkflowCtx, input: Order) -> Receipt:
        if input.amount < 0:
            raise ValueError("negative amount")
        await ctx.sleep(5)
        return Receipt(charged=await ctx.step(lambda: input.amount * 2, name="charge"))


@workflow(name="order")
class OrderFlow:
    async def run(self, ctx: WorkflowCtx, input: Order) -> int:
        receipt = await ctx.child(Payment, input)
        assert isinstance(receipt, Receipt)
        return receipt.charged + 1


async def test_child_returns_its_output_and_names_its_parent(backend: Backend) -> None:
    async with TestEnv([OrderFlow(), Payment()], store=backend.store) as env:
        await env.start("order", {"amount": 20}, "o1")
        await env.run_until_idle()
        assert await env.result("o1") == 41
        child = await env.get_run("o1.child.1")
        assert child.parent_id == "o1" and child.status is RunStatus.COMPLETED
        assert (await env.get_run("o1")).parent_id is None
        h = await env.history("o1")
        assert h.types == ["run_started", "child_started", "child_completed", "run_completed"]
        started = h.events[1]
        assert started.run_id == "o1.child.1" and started.workflow == "payment"  # type: ignore[union-attr]
        kids = await env.engines[0].list_runs(parent_id="o1")
        assert [r.id for r in kids] == ["o1.child.1"]
        assert await env.engines[0].list_runs(parent_id="o1.child.1") == []


async def test_the_parent_wakes_when_its_child_settles_not_at_the_poll(backend: Backend) -> None:
    async with TestEnv([OrderFlow(), Payment()], store=backend.store) as env:
        await env.start("order", {"amount": 1}, "o1")
        await env.settle()
        assert (await env.get_run("o1")).status is RunStatus.SUSPENDED
        t0 = env.clock.now()
        await env.advance(5)  # the child's timer fires; it completes, and so does its parent
        await env.settle()
        assert (await env.get_run("o1")).status is RunStatus.COMPLETED
        assert env.clock.now() - t0 < CHILD_POLL
        h = await env.history("o1")
        assert h.events[-1].at - t0 == pytest.approx(5)


@workflow(name="fan-out")
class FanOut:
    async def run(self, ctx: WorkflowCtx, input: list[int]) -> list[int]:
        handles = [await ctx.start_child(Payment, {"amount": a}) for a in input]
        assert all(isinstance(h, ChildHandle) for h in handles)
        direct = await ctx.gather(*(ctx.child("payment", {"amount": a}) for a in input))
        later = await ctx.gather(*(h.result() for h in handles))
        return [r.charged for r in later] + [r.charged for r in direct]


async def test_start_child_handles_and_gather(backend: Backend) -> None:
    async with TestEnv([FanOut(), Payment()], store=backend.store) as env:
        await env.start("fan-out", [1, 2], "f")
        await env.run_until_idle()
        assert await env.result("f") == [2, 4, 2, 4]
        kids = await env.engines[0].list_runs(parent_id="f")
        assert sorted(r.id for r in kids) == [f"f.child.{n}" for n in (1, 2, 3, 4)]
        types = (await env.history("f")).types
        assert types.count("child_started") == 4 and types.count("child_completed") == 4


@workflow(name="careful")
class Careful:
    async def run(self, ctx: WorkflowCtx, input: dict[str, object]) -> str:
        try:
            await ctx.child(input["wf"], input["input"], run_id=input.get("id"))  # type: ignore[arg-type]
        except ChildWorkflowError as err:
            return f"{err.run_id}:{type(err.cause).__name__}"
        return "ok"


@pytest.mark.parametrize(
    ("wf", "inp", "cause"),
    [
        ("payment", {"amount": -1}, "WorkflowFailedError"),  # the child failed
        ("payment", {"amount": "x"}, "FlowkitError"),  # invalid input: it never started
        ("nope", {}, "FlowkitError"),  # unknown workflow
    ],
)
async def test_a_failed_or_unstartable_child_fails_the_call(
    backend: Backend, wf: str, inp: object, cause: str
) -> None:
    async with TestEnv([Careful(), Payment()], store=backend.store) as env:
        await env.start("careful", {"wf": wf, "input": inp}, "c")
        await env.run_until_idle()
        assert await env.result("c") == f"c.child.1:{cause}"
        h = await env.history("c")
        assert "child_failed" in h.types
        await replay_async(h, Careful)  # the replay raises the same from the history alone


@workflow(name="lane", singleton=Singleton(key=lambda i: "k", max_queue_depth=0))
class Lane:
    async def run(self, ctx: WorkflowCtx, input: int) -> str:
        if input == 0:
            return "leaf"
        try:
            return await ctx.child(Lane, input - 1)
        except ChildWorkflowError as err:
            return f"refused: {err}"


async def test_a_singleton_parent_never_awaits_a_child_queued_behind_itself(
    backend: Backend,
) -> None:
    async with TestEnv([Lane()], store=backend.store) as env:
        await env.start("lane", 1, "l")
        await env.run_until_idle()
        out = await env.result("l")
        assert out.startswith("refused:") and "singleton key 'k'" in out
        with pytest.raises(RunNotFoundError):
            await env.get_run("l.child.1")  # never created


@workflow(name="waits-forever")
class WaitsForever:
    async def run(self, ctx: WorkflowCtx, input: int) -> None:
        if input > 0:
            await ctx.child(WaitsForever, input - 1)
        await ctx.wait_for_signal("never")


async def test_cancelling_a_parent_cancels_its_children_recursively(backend: Backend) -> None:
    async with TestEnv([WaitsForever()], store=backend.store) as env:
        await env.start("waits-forever", 2, "w")
        await env.settle()
        assert (await env.get_run("w.child.1.child.1")).status is RunStatus.SUSPENDED
        await env.engines[0].cancel("w")
        await env.run_until_idle()
        for rid in ("w", "w.child.1", "w.child.1.child.1"):
            assert (await env.get_run(rid)).status is RunStatus.CANCELLED, rid
        with pytest.raises(RunCancelledError):
            await env.result("w")


@workflow(name="flaky-parent")
class FlakyParent:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        a = await ctx.child(Payment, {"amount": 3})
        b = await ctx.step(lambda: 1, name="one", retry=RetryPolicy(max_attempts=2))
        return int(a.charged) + b


@pytest.mark.parametrize(
    "point", ["before_child_create", "after_child_create", "before_child_record"]
)
async def test_a_crash_around_the_child_start_starts_one_child(
    backend: Backend, point: str
) -> None:
    async with TestEnv([FlakyParent(), Payment()], store=backend.store, instances=2) as env:
        env.crash_at(0, point)
        await env.start("flaky-parent", None, "p")
        await env.run_until_idle()
        assert [f[3] for f in env.fired] == ["crash"]  # it did crash there
        await env.restart(0)
        await env.run_until_idle()
        assert await env.result("p") == 7
        kids = await env.engines[1].list_runs(parent_id="p")
        assert [r.id for r in kids] == ["p.child.1"]
        h = await env.history("p")
        assert h.types.count("child_started") == 1
        assert (await env.history("p.child.1")).types.count("run_started") == 1


async def test_a_lost_wake_up_costs_the_poll_interval_never_a_hang(backend: Backend) -> None:
    async with TestEnv([OrderFlow(), Payment()], store=backend.store) as env:
        # every wake-up delivery fails: the parent looks at its child after CHILD_POLL anyway
        env.inject(Rule(op="deliver_signal", action="fault", times=None))
        await env.start("order", {"amount": 1}, "o1")
        await env.settle()
        t0 = env.clock.now()
        await env.advance(5)
        await env.settle()
        assert (await env.get_run("o1.child.1")).status is RunStatus.COMPLETED
        assert (await env.get_run("o1")).status is RunStatus.SUSPENDED  # not woken
        await env.run_until_idle()
        assert await env.result("o1") == 3
        done = (await env.history("o1")).events[-1].at
        assert t0 + 5 < done <= t0 + CHILD_POLL + 1e-6


@workflow(name="pinned-id")
class PinnedId:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        try:
            out = await ctx.child(OrderFlow, {"amount": 1}, run_id=input, tags=["mine"])
        except ChildWorkflowError as err:
            return f"refused {type(err.cause).__name__}"
        return f"got {out}"


async def test_an_explicit_child_id_and_one_taken_by_another_run(backend: Backend) -> None:
    async with TestEnv([PinnedId(), OrderFlow(), Payment()], store=backend.store) as env:
        await env.start("pinned-id", "kid-a", "p1")
        await env.run_until_idle()
        assert await env.result("p1") == "got 3"
        kid = await env.get_run("kid-a")
        assert kid.parent_id == "p1" and "mine" in kid.tags
        # an id some other run has: not this parent's child
        await env.start("pinned-id", "kid-a", "p2")
        await env.run_until_idle()
        assert await env.result("p2") == "refused FlowkitError"
        assert [r.id for r in await env.engines[0].list_runs(parent_id="p2")] == []


@workflow(name="queued", singleton=Singleton(key=lambda i: "q", max_queue_depth=0))
class Queued:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        await ctx.wait_for_signal("go")
        return input


@workflow(name="queues-a-child")
class QueuesAChild:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            await ctx.child(Queued, 2)
        except ChildWorkflowError as err:
            return str(err)
        return "started"


async def test_a_full_singleton_queue_fails_the_child_call(backend: Backend) -> None:
    async with TestEnv([QueuesAChild(), Queued()], store=backend.store) as env:
        await env.start("queued", 1, "holder")
        await env.settle()
        await env.start("queues-a-child", None, "p")
        await env.run_until_idle()
        out = await env.result("p")
        assert "SingletonQueueFullError" in out
        h = await env.history("p")
        assert h.types == ["run_started", "child_failed", "run_completed"]


@workflow(name="order")
class OrderFlowChanged:
    async def run(self, ctx: WorkflowCtx, input: Order) -> int:
        receipt = await ctx.child(OrderFlow, input)  # another workflow at the same position
        return int(receipt)


async def test_a_changed_child_call_diverges_on_replay(backend: Backend) -> None:
    async with TestEnv([OrderFlow(), Payment()], store=backend.store) as env:
        await env.start("order", {"amount": 2}, "o1")
        await env.run_until_idle()
        h = await env.history("o1")
    await replay_async(h, OrderFlow)
    with pytest.raises(NonDeterminismError, match="child"):
        await replay_async(h, OrderFlowChanged)


@workflow(name="timed-parent", execution_timeout=30)
class TimedParent:
    async def run(self, ctx: WorkflowCtx, input: None) -> None:
        await ctx.child(WaitsForever, 1)


async def test_a_parent_s_deadline_cancels_its_children(backend: Backend) -> None:
    async with TestEnv([TimedParent(), WaitsForever()], store=backend.store, instances=2) as env:
        await env.start("timed-parent", None, "t")
        await env.settle()
        assert (await env.get_run("t.child.1.child.1")).status is RunStatus.SUSPENDED
        await env.run_until_idle()
        for rid in ("t", "t.child.1", "t.child.1.child.1"):
            assert (await env.get_run(rid)).status is RunStatus.CANCELLED, rid


@workflow(name="cancel-a-child")
class CancelledChildParent:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            await ctx.child(WaitsForever, 0)
        except ChildWorkflowError as err:
            return type(err.cause).__name__
        return "completed"


async def test_a_cancelled_child_fails_its_parent_s_call(backend: Backend) -> None:
    async with TestEnv([CancelledChildParent(), WaitsForever()], store=backend.store) as env:
        await env.start("cancel-a-child", None, "p")
        await env.settle()
        await env.engines[0].cancel("p.child.1")
        await env.settle()  # woken by its child's settlement: no time passes
        assert await env.result("p") == "RunCancelledError"


@workflow(name="counter")
class Counter_:
    """A child that continues as new twice (each run sleeps 5 s), then returns its count."""

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        await ctx.sleep(5)
        if input < 2:
            ctx.continue_as_new(input + 1)
        return input


@workflow(name="counts")
class Counts:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        return int(await ctx.child(Counter_, 0))


async def test_a_child_that_continues_as_new_is_followed_to_its_chain_s_end(
    backend: Backend,
) -> None:
    """The parent gets the output of the child's last run, and its settlement wakes the
    parent at once (not at the poll)."""
    async with TestEnv([Counts(), Counter_()], store=backend.store) as env:
        await env.start("counts", None, "c")
        t0 = env.clock.now()
        assert await env.result("c") == 2
        chain = [r.id for r in await env.engines[0].list_runs(parent_id="c")]
        assert chain == ["c.child.1", "c.child.1~1", "c.child.1~2"]
        h = await env.history("c")
        assert h.types[-2:] == ["child_completed", "run_completed"]
        assert h.events[-1].at - t0 == pytest.approx(15)


@workflow(name="tilde-parent")
class TildeParent:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        return int(await ctx.child(Counter_, 2, run_id="job~5"))


async def test_a_child_id_ending_in_tilde_n_still_wakes_its_parent_at_once(
    backend: Backend,
) -> None:
    """An explicit child id that merely ends in ``~5`` (no chain behind it) is the id the
    parent knows: its settlement wakes the parent at once, not at the poll."""
    async with TestEnv([TildeParent(), Counter_()], store=backend.store) as env:
        await env.start("tilde-parent", None, "tp")
        t0 = env.clock.now()
        assert await env.result("tp") == 2
        assert (await env.history("tp")).events[-1].at - t0 == pytest.approx(5)
