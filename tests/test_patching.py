"""``ctx.patched`` / ``ctx.deprecate_patch`` (docs/writing-workflows.md, "Patching"): a deploy
changes a body in place while runs of the old code are in flight. The whole life cycle (v1 →
patched → deprecated → patch removed) on every store, then each rule on its own."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import flowkit
from flowkit import (
    History,
    NonDeterminismError,
    RunStatus,
    WorkflowCtx,
    workflow,
)
from flowkit._replay.patches import parse_pos, passed
from flowkit.events import PatchMarker, RunStarted, StepCompleted
from flowkit_testing import TestEnv


class Billing:
    """What the workflows call; it counts which charge each order got."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()

    def price(self, order: str) -> int:
        self.calls[("price", order)] += 1
        return 100

    def charge(self, order: str, cents: int) -> str:
        self.calls[("charge", order)] += 1
        return f"charged {cents}"

    def charge_with_fee(self, order: str, cents: int) -> str:
        self.calls[("charge_with_fee", order)] += 1
        return f"charged {cents} + 5 fee"

    def receipt(self, order: str) -> str:
        return f"receipt {order}"


BILLING = Billing()


@workflow(name="invoice")
class InvoiceV1:
    def __init__(self, billing: Billing = BILLING) -> None:
        self.billing = billing

    async def run(self, ctx: WorkflowCtx, order: str) -> list[str]:
        cents = await ctx.step(self.billing.price, order)
        charged = await ctx.step(self.billing.charge, order, cents)
        await ctx.sleep(3600)
        return [charged, await ctx.step(self.billing.receipt, order)]


@workflow(name="invoice")
class InvoicePatched(InvoiceV1):
    async def run(self, ctx: WorkflowCtx, order: str) -> list[str]:
        cents = await ctx.step(self.billing.price, order)
        if ctx.patched("fee"):
            charged = await ctx.step(self.billing.charge_with_fee, order, cents)
        else:
            charged = await ctx.step(self.billing.charge, order, cents)
        await ctx.sleep(3600)
        return [charged, await ctx.step(self.billing.receipt, order)]


@workflow(name="invoice")
class InvoiceDeprecated(InvoiceV1):
    async def run(self, ctx: WorkflowCtx, order: str) -> list[str]:
        cents = await ctx.step(self.billing.price, order)
        ctx.deprecate_patch("fee")
        charged = await ctx.step(self.billing.charge_with_fee, order, cents)
        await ctx.sleep(3600)
        return [charged, await ctx.step(self.billing.receipt, order)]


@workflow(name="invoice")
class InvoiceFinal(InvoiceV1):
    async def run(self, ctx: WorkflowCtx, order: str) -> list[str]:
        cents = await ctx.step(self.billing.price, order)
        charged = await ctx.step(self.billing.charge_with_fee, order, cents)
        await ctx.sleep(3600)
        return [charged, await ctx.step(self.billing.receipt, order)]


OLD = ["charged 100", "receipt {}"]
NEW = ["charged 100 + 5 fee", "receipt {}"]


async def deploy(env: TestEnv, code: Any) -> None:
    env.workflows = [code]
    await env.restart(0)


async def output(env: TestEnv, run_id: str) -> Any:
    """The output of a run that has completed (``env.result`` would run every run to its
    end, the ones meant to stay in flight too)."""
    run = await env.get_run(run_id)
    assert run.status is RunStatus.COMPLETED, (run.status, run.error)
    return run.output


def markers(h: History) -> list[str]:
    return [e.patch_id for e in h if isinstance(e, PatchMarker)]


async def test_the_life_cycle_of_a_patch(store: Any) -> None:
    """v1 → patched → deprecated → removed, a run in flight across each deploy: each run
    finishes on the branch it started on, and every history replays against every deploy
    that must accept it."""
    billing = Billing()
    async with TestEnv([InvoiceV1(billing)], store=store) as env:
        await env.start("invoice", "o1", "v1-run")  # v1: charged, asleep for an hour
        await env.advance(10)

        await deploy(env, InvoicePatched(billing))
        assert (await env.get_run("v1-run")).status is RunStatus.SUSPENDED
        await env.start("invoice", "o2", "patched-run")
        await env.advance(3595)  # v1-run's hour is over; patched-run still sleeps
        assert await output(env, "v1-run") == [OLD[0], OLD[1].format("o1")]
        assert (await env.get_run("patched-run")).status is RunStatus.SUSPENDED
        v1_history = await env.history("v1-run")
        assert markers(v1_history) == []
        await flowkit.replay_async(v1_history, InvoicePatched)
        await flowkit.replay_async(v1_history, InvoiceV1)  # a marker never shifted a position

        await deploy(env, InvoiceDeprecated(billing))
        await env.start("invoice", "o3", "deprecated-run")
        await env.advance(100)  # patched-run's hour is over
        assert await output(env, "patched-run") == [NEW[0], NEW[1].format("o2")]
        assert (await env.get_run("deprecated-run")).status is RunStatus.SUSPENDED

        await deploy(env, InvoiceFinal(billing))
        await env.advance(3600)
        assert await env.result("deprecated-run") == [NEW[0], NEW[1].format("o3")]
        patched_history = await env.history("patched-run")
        deprecated_history = await env.history("deprecated-run")

    assert billing.calls == Counter(
        {
            ("price", "o1"): 1,
            ("charge", "o1"): 1,
            ("price", "o2"): 1,
            ("charge_with_fee", "o2"): 1,
            ("price", "o3"): 1,
            ("charge_with_fee", "o3"): 1,
        }
    )
    assert markers(patched_history) == ["fee"]
    # the deprecate deploy recorded the marker, so the patched code (a rolling deploy's older
    # workers) replays its runs
    assert markers(deprecated_history) == ["fee"]
    for h in (patched_history, deprecated_history):
        assert History.from_json(h.to_json()) == h
        for code in (InvoicePatched, InvoiceDeprecated, InvoiceFinal):
            await flowkit.replay_async(h, code)
    # the v1 history replays against v1 and the patched code, not the deprecated one
    await flowkit.replay_async(v1_history, InvoicePatched)
    with pytest.raises(NonDeterminismError) as err:
        await flowkit.replay_async(v1_history, InvoiceDeprecated)
    assert err.value.position == "2"
    assert "ctx.deprecate_patch('fee') ran on a history recorded without patch 'fee'" in str(
        err.value
    )
    # and a history that took the patch does not replay against code without the new branch
    with pytest.raises(NonDeterminismError) as err:
        await flowkit.replay_async(patched_history, InvoiceV1)
    assert err.value.position == "2"
    assert "the history took patch 'fee' (patch_marker#3)" in str(err.value)
    assert "patch_marker#3('fee')" in err.value.window


@workflow(name="late")
class LateV1:
    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        await ctx.step(BILLING.price, "late")
        await ctx.sleep(60)
        return await ctx.step(BILLING.receipt, "old")


@workflow(name="late")
class LatePatched:
    """The patch point is after the sleep in-flight runs wait in."""

    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        await ctx.step(BILLING.price, "late")
        await ctx.sleep(60)
        return await ctx.step(BILLING.receipt, "new" if ctx.patched("late") else "old")


async def test_a_run_suspended_before_the_patch_point_takes_the_new_branch(store: Any) -> None:
    """Nothing was recorded past the point: the run is on new ground there."""
    async with TestEnv([LateV1()], store=store) as env:
        await env.start("late", None, "r")
        await env.advance(1)
        await deploy(env, LatePatched())
        await env.advance(60)
        assert await env.result("r") == "receipt new"
        h = await env.history("r")
    assert h.types[-4:] == ["timer_fired", "patch_marker", "step_completed", "run_completed"]
    await flowkit.replay_async(h, LatePatched)


@workflow(name="tail")
class TailV1:
    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        await ctx.step(BILLING.price, "tail")
        return "v1"


@workflow(name="tail")
class TailPatched:
    """A patch after the last call: only a terminal event says the old code passed it."""

    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        await ctx.step(BILLING.price, "tail")
        return "v2" if ctx.patched("tail") else "v1"


async def test_a_completed_run_replays_on_the_old_branch() -> None:
    async with TestEnv([TailV1()]) as env:
        await env.start("tail", None, "old")
        await env.result("old")
        await deploy(env, TailPatched())
        await env.start("tail", None, "new")
        assert await env.result("new") == "v2"
        old, new = await env.history("old"), await env.history("new")
    await flowkit.replay_async(old, TailPatched)  # output "v1" again: no divergence
    await flowkit.replay_async(new, TailPatched)
    with pytest.raises(NonDeterminismError, match="a different output"):
        await flowkit.replay_async(new, TailV1)


@workflow(name="twice")
class TwiceV1:
    async def run(self, ctx: WorkflowCtx, _: None) -> list[bool]:
        await ctx.step(BILLING.price, "twice")
        await ctx.sleep(60)
        return []


@workflow(name="twice")
class TwicePatched:
    async def run(self, ctx: WorkflowCtx, _: None) -> list[bool]:
        first = ctx.patched("p")  # before the recorded step: the old code ran here
        await ctx.step(BILLING.price, "twice")
        await ctx.sleep(60)
        return [first, ctx.patched("p")]  # new ground, but the answer is fixed


async def test_an_answer_is_fixed_once_given(store: Any) -> None:
    async with TestEnv([TwiceV1()], store=store) as env:
        await env.start("twice", None, "old")
        await env.advance(1)
        await deploy(env, TwicePatched())
        await env.start("twice", None, "new")
        await env.advance(60)
        assert await env.result("old") == [False, False]
        assert await env.result("new") == [True, True]
        old, new = await env.history("old"), await env.history("new")
    assert markers(old) == [] and markers(new) == ["p"]  # one marker, not one per call
    await flowkit.replay_async(old, TwicePatched)
    await flowkit.replay_async(new, TwicePatched)


@workflow(name="fan")
class FanV1:
    async def left(self, ctx: WorkflowCtx) -> str:
        await ctx.step(BILLING.price, "left")
        await ctx.sleep(60)
        return await ctx.step(BILLING.receipt, "left-old")

    async def right(self, ctx: WorkflowCtx) -> str:
        return await ctx.step(BILLING.receipt, "right-old")

    async def run(self, ctx: WorkflowCtx, _: None) -> list[str]:
        return await ctx.gather(self.left(ctx), self.right(ctx))


@workflow(name="fan")
class FanPatched(FanV1):
    async def left(self, ctx: WorkflowCtx) -> str:
        await ctx.step(BILLING.price, "left")
        await ctx.sleep(60)
        # this branch has nothing recorded past here (its sibling's steps do not count)
        return await ctx.step(BILLING.receipt, "left-new" if ctx.patched("left") else "left-old")

    async def right(self, ctx: WorkflowCtx) -> str:
        # this branch's step is recorded: the old code ran here
        new = ctx.patched("right")
        return await ctx.step(BILLING.receipt, "right-new" if new else "right-old")


async def test_gather_branches_decide_each_for_itself(store: Any) -> None:
    async with TestEnv([FanV1()], store=store) as env:
        await env.start("fan", None, "r")
        await env.advance(1)
        await deploy(env, FanPatched())
        await env.advance(60)
        assert await env.result("r") == ["receipt left-new", "receipt right-old"]
        h = await env.history("r")
    assert markers(h) == ["left"]
    await flowkit.replay_async(h, FanPatched)


class Flaky:
    def __init__(self) -> None:
        self.fixed = False

    def load(self, batch: str) -> int:
        raise ValueError("locked")

    def load_fixed(self, batch: str) -> int:
        return 42


@workflow(name="load")
class LoadV1:
    def __init__(self, flaky: Flaky) -> None:
        self.flaky = flaky

    async def run(self, ctx: WorkflowCtx, batch: str) -> int:
        await ctx.step(BILLING.price, batch)
        return await ctx.step(self.flaky.load, batch)


@workflow(name="load")
class LoadPatched(LoadV1):
    async def run(self, ctx: WorkflowCtx, batch: str) -> int:
        early = ctx.patched("early")  # the price step was recorded: old branch
        await ctx.step(BILLING.price, batch)
        if early:
            raise AssertionError("the price step was recorded before the patch")
        if ctx.patched("fix"):  # the failure was forgotten by the retry: new ground
            return await ctx.step(self.flaky.load_fixed, batch)
        return await ctx.step(self.flaky.load, batch)


async def test_a_retried_run_takes_the_patch_past_its_forgotten_failure(store: Any) -> None:
    flaky = Flaky()
    async with TestEnv([LoadV1(flaky)], store=store) as env:
        await env.start("load", "b", "r")
        await env.run_until_idle()
        assert (await env.get_run("r")).status is RunStatus.FAILED
        await deploy(env, LoadPatched(flaky))
        await env.retry("r")
        assert await env.result("r") == 42
        h = await env.history("r")
    assert markers(h) == ["fix"]
    await flowkit.replay_async(h, LoadPatched)


BAD_IDS: dict[str, Any] = {"empty": "", "long": "p" * 256, "int": 7, "none": None, "nul": "a\x00"}


@workflow(name="bad-patch")
class BadPatch:
    async def run(self, ctx: WorkflowCtx, which: str) -> bool:
        return ctx.patched(BAD_IDS.get(which, which))


@pytest.mark.parametrize("which", sorted(BAD_IDS))
async def test_a_bad_patch_id_fails_the_run_and_records_no_marker(which: str) -> None:
    async with TestEnv([BadPatch()]) as env:
        await env.start("bad-patch", which, "r")
        await env.run_until_idle()
        run = await env.get_run("r")
        h = await env.history("r")
    assert run.status is RunStatus.FAILED
    assert run.error is not None and run.error["type"] == "InvalidInputError"
    assert "patch id" in run.error["message"]
    assert markers(h) == []
    await flowkit.replay_async(h, BadPatch)  # the same failure again


async def test_the_longest_patch_id_is_kept() -> None:
    async with TestEnv([BadPatch()]) as env:
        await env.start("bad-patch", "p" * 255, "r")
        assert await env.result("r") is True
        assert markers(await env.history("r")) == ["p" * 255]


async def test_replay_only_records_nothing_at_the_frontier() -> None:
    """A history that stops before the patch point (an in-flight run) replays: the patch is
    taken as a live worker would, and nothing is recorded (replay never records)."""
    started = RunStarted(seq=1, workflow="invoice", version="1", input="o9")
    price = StepCompleted(seq=2, pos="1", name="Billing.price", result=100)
    await flowkit.replay_async(History("r", [started, price]), InvoicePatched)
    await flowkit.replay_async(History("r", [started, price]), InvoiceDeprecated)


def test_positions_past_a_point() -> None:
    assert parse_pos("3.1/2.0/4") == (3, 1, 2, 0, 4)
    root = (2,)  # the body, after its second call
    assert not passed(root, [(1,), (2,), (2, 0, 1)])  # its calls and a gather at 2: before
    assert passed(root, [(3,)]) and passed(root, [(3, 0, 1)])
    branch = (3, 1, 2)  # branch 1 of the gather at 3, after its second call
    assert passed(branch, [(3, 1, 3)]) and passed(branch, [(3, 1, 3, 0, 1)])
    assert passed(branch, [(4,)])  # the body went on: the gather had returned
    assert not passed(branch, [(3, 0, 5), (3, 2, 9), (3, 1, 2, 0, 1), (3, 1, 1), (2,), (3,)])
