"""Typed errors for bad input (and nothing written), non-determinism blocking a run,
``flowkit.replay`` and ``History`` JSON."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pydantic import BaseModel

import flowkit
from flowkit import History, RunCancelledError, RunStatus, WorkflowCtx, workflow
from flowkit.stores import MemoryStore
from flowkit_testing import TestEnv

if TYPE_CHECKING:
    from decimal import Decimal as OnlyForTypeCheckers

# -- bad input writes nothing ------------------------------------------------------------


class Order(BaseModel):
    item: str
    qty: int


@workflow(name="order")
class OrderFlow:
    async def run(self, ctx: WorkflowCtx, input: Order) -> int:
        assert isinstance(input, Order)
        return input.qty * 2


@workflow(name="unregistered")
class Unregistered:
    async def run(self, ctx: WorkflowCtx, input: None) -> None:
        return None


async def test_invalid_input_raises_and_writes_nothing() -> None:
    async with TestEnv([OrderFlow()]) as env:
        eng = env.engines[0]
        bad_inputs: list[object] = [{"item": "x", "qty": "many"}, {"item": "x"}, 5, None]
        for bad in bad_inputs:
            with pytest.raises(flowkit.InvalidInputError) as ei:
                await eng.start("order", bad, "r-bad")
            assert ei.value.workflow == "order"
            assert isinstance(ei.value, ValueError)
        await env.run_until_idle()
        assert await eng.list_runs() == []
        with pytest.raises(flowkit.RunNotFoundError):
            await eng.history("r-bad")

        await env.start("order", {"item": "x", "qty": "3"}, "r-dict")  # coerced
        assert await env.result("r-dict") == 6
        await env.start(OrderFlow, Order(item="y", qty=4), "r-model")
        assert await env.result("r-model") == 8
        assert [r.id for r in await eng.list_runs()] == ["r-dict", "r-model"]


async def test_unknown_workflow_raises_and_writes_nothing() -> None:
    async with TestEnv([OrderFlow()]) as env:
        eng = env.engines[0]
        for wf in ("nope", Unregistered, Unregistered()):
            with pytest.raises(flowkit.WorkflowNotFoundError):
                await eng.start(wf, None, "r1")
        with pytest.raises(flowkit.WorkflowNotFoundError):
            await eng.signal_with_start("nope", None, "r1", "go")
        assert await eng.list_runs() == []


async def test_unknown_run_raises_run_not_found() -> None:
    async with TestEnv([OrderFlow()]) as env:
        eng = env.engines[0]
        calls = [
            lambda: eng.signal("ghost", "go", 1),
            lambda: eng.cancel("ghost"),
            lambda: eng.result("ghost", timeout=1),
            lambda: eng.get_run("ghost"),
            lambda: eng.history("ghost"),
            lambda: eng.retry("ghost"),
        ]
        for call in calls:
            with pytest.raises(flowkit.RunNotFoundError) as ei:
                await call()
            assert ei.value.run_id == "ghost"
        assert await eng.list_runs() == []


@workflow(name="any-input")
class AnyInput:
    async def run(self, ctx: WorkflowCtx, input: object) -> object:
        return await ctx.wait_for_signal("go")


async def test_unserializable_input_and_signal_payload_write_nothing() -> None:
    async with TestEnv([AnyInput()]) as env:
        eng = env.engines[0]
        with pytest.raises(flowkit.InvalidInputError):
            await eng.start("any-input", object(), "r1")
        assert await eng.list_runs() == []
        await env.start("any-input", {"ok": True}, "r1")
        before = await env.history("r1")
        with pytest.raises(flowkit.InvalidInputError):  # (the caller's input, as at start)
            await eng.signal("r1", "go", object())
        with pytest.raises(ValueError):
            await eng.signal("r1", "", 1)
        await env.run_until_idle()
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        assert await env.history("r1") == before
        await env.signal("r1", "go", [1, 2])
        assert await env.result("r1") == [1, 2]


class Opaque:
    pass


@workflow(name="bad-bodies")
class BadBodies:
    def make_thing(self) -> object:
        return Opaque()

    def surrogate(self) -> str:
        return "\ud800"  # a str that is not UTF-8: no JSON library writes it

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        if input == "unserializable":
            await ctx.step(self.make_thing, name="make-thing")
        elif input == "negative-sleep":
            await ctx.sleep(-1)
        elif input == "surrogate":
            await ctx.step(self.surrogate, name="make-thing")
        elif input == "step-name-not-str":
            await ctx.step(self.make_thing, name=7)  # type: ignore[call-overload]
        return "unreachable"


@pytest.mark.parametrize("body", ["unserializable", "surrogate"])
async def test_non_serializable_step_result_fails_the_run_naming_the_step(body: str) -> None:
    async with TestEnv([BadBodies()]) as env:
        await env.start("bad-bodies", body, "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await env.result("r1")
        cause = ei.value.cause
        assert isinstance(cause, flowkit.StepFailedError)
        assert cause.step == "make-thing"
        assert cause.error_type == "SerializationError"
        assert "make-thing" in cause.message
        run = await env.get_run("r1")
        assert run.status is RunStatus.FAILED
        assert run.error is not None and run.error["step"] == "make-thing"
        assert (await env.history("r1")).types[-2:] == ["step_failed", "run_failed"]


@dataclasses.dataclass
class Half:
    """A type pydantic cannot build an adapter for: its field's type is imported only for type
    checkers, so the annotation cannot be resolved at run time."""

    x: OnlyForTypeCheckers


def make_half() -> Half:
    return Half(1)  # type: ignore[arg-type]


@workflow(name="half-typed")
class HalfTyped:
    async def run(self, ctx: WorkflowCtx, input: str) -> Half:
        if input == "step":
            await ctx.step(make_half, name="make-half")
        return make_half()


@pytest.mark.parametrize("where", ["step", "output"])
async def test_a_result_type_pydantic_cannot_build_fails_cleanly(where: str) -> None:
    """A step result or workflow output whose type pydantic cannot resolve fails the step (or
    the run) with a SerializationError, as any value it cannot serialize."""
    async with TestEnv([HalfTyped()]) as env:
        await env.start("half-typed", where, "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await env.result("r1")
        types = (await env.history("r1")).types
        if where == "step":
            assert isinstance(ei.value.cause, flowkit.StepFailedError)
            assert ei.value.cause.error_type == "SerializationError"
            assert types[-2:] == ["step_failed", "run_failed"]
        else:
            assert ei.value.error["type"] == "SerializationError"
            assert types[-1] == "run_failed"


async def test_negative_sleep_fails_the_run_with_value_error() -> None:
    async with TestEnv([BadBodies()]) as env:
        await env.start("bad-bodies", "negative-sleep", "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await env.result("r1")
        assert ei.value.error["type"] == "InvalidInputError"  # (a ValueError)
        assert "timer_started" not in (await env.history("r1")).types


async def test_a_step_name_that_is_not_a_string_fails_before_the_step_runs() -> None:
    bodies = BadBodies()
    made = []
    bodies.make_thing = lambda: made.append(1)  # type: ignore[method-assign,assignment]
    async with TestEnv([bodies]) as env:
        await env.start("bad-bodies", "step-name-not-str", "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await env.result("r1")
        assert ei.value.error["type"] == "TypeError"
        assert "name=" in ei.value.error["message"]
        assert made == []  # (no side effect ran)
        assert "step_completed" not in (await env.history("r1")).types


def test_duplicate_workflow_names_rejected_at_construction() -> None:
    @workflow(name="order")
    class Clash:
        async def run(self, ctx: WorkflowCtx, input: None) -> None:
            return None

    with pytest.raises(ValueError, match="order"):
        flowkit.Engine(MemoryStore(), [OrderFlow(), Clash()])
    with pytest.raises(ValueError):
        flowkit.Engine(MemoryStore(), [OrderFlow(), OrderFlow()])


# -- a changed body: blocked, history untouched, resumes once fixed ------------------------

BODY = {"variant": "A"}


@pytest.fixture(autouse=True)
def _reset_body() -> Iterator[None]:
    BODY["variant"] = "A"
    yield
    BODY["variant"] = "A"


@workflow(name="evolving")
class Evolving:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def step_a(self) -> str:
        self.calls["a"] += 1
        return "a"

    def step_b(self) -> str:
        self.calls["b"] += 1
        return "b"

    def finish(self) -> str:
        self.calls["finish"] += 1
        return "!"

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        if BODY["variant"] == "B":
            x = await ctx.step(self.step_b)
        else:
            x = await ctx.step(self.step_a)
        if BODY["variant"] != "C":  # C returns early, skipping recorded events
            await ctx.sleep(10)
        return x + await ctx.step(self.finish)


async def test_changed_body_blocks_the_run_until_fixed() -> None:
    wf = Evolving()
    async with TestEnv([wf]) as env:
        await env.start("evolving", None, "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        before = await env.history("r1")

        BODY["variant"] = "B"
        await env.advance(10)
        run = await env.get_run("r1")
        assert run.status is RunStatus.BLOCKED
        assert run.error is not None and run.error["type"] == "NonDeterminismError"
        assert "step_a" in run.error["message"] and "step_b" in run.error["message"]
        assert run.wake_at == pytest.approx(env.clock.now() + 60)
        assert await env.history("r1") == before
        assert wf.calls == {"a": 1}

        BODY["variant"] = "A"
        await env.advance(59)
        assert (await env.get_run("r1")).status is RunStatus.BLOCKED
        await env.advance(1)
        assert await env.result("r1") == "a!"
        assert wf.calls == {"a": 1, "finish": 1}
        run = await env.get_run("r1")
        assert run.status is RunStatus.COMPLETED and run.error is None
        h = await env.history("r1")
        assert h.events[: len(before)] == before.events
        assert h.types[len(before) :] == ["timer_fired", "step_completed", "run_completed"]


async def test_cancelling_a_blocked_run_settles_it_at_once() -> None:
    """A blocked body cannot be replayed to deliver the cancellation, so cancel settles it."""
    wf = Evolving()
    async with TestEnv([wf]) as env:
        await env.start("evolving", None, "r1")
        BODY["variant"] = "B"
        await env.advance(10)
        assert (await env.get_run("r1")).status is RunStatus.BLOCKED
        await env.cancel("r1")
        run = await env.get_run("r1")
        assert run.status is RunStatus.CANCELLED
        assert (await env.history("r1")).types[-2:] == ["cancel_requested", "run_cancelled"]
        with pytest.raises(RunCancelledError):
            await env.engines[0].result("r1", timeout=1)


# -- flowkit.replay and History JSON ------------------------------------------------------


async def _record_evolving() -> tuple[History, History]:
    async with TestEnv([Evolving()]) as env:
        await env.start("evolving", None, "r1")
        partial = await env.history("r1")
        await env.result("r1")
        return partial, await env.history("r1")


def test_replay_sync_passes_and_detects_divergence() -> None:
    partial, full = asyncio.run(_record_evolving())
    flowkit.replay(full, Evolving)
    flowkit.replay(partial, Evolving)
    flowkit.replay(full.to_json(), Evolving)
    flowkit.replay(full, Evolving())
    with pytest.raises(flowkit.HistoryError):
        flowkit.replay("garbage", Evolving)
    for variant in ("B", "C"):
        BODY["variant"] = variant
        with pytest.raises(flowkit.NonDeterminismError):
            flowkit.replay(full, Evolving)
    BODY["variant"] = "B"
    with pytest.raises(flowkit.NonDeterminismError):
        flowkit.replay(partial, Evolving)


async def test_replay_async_with_foreign_workflow_raises_history_error() -> None:
    _, full = await _record_evolving()
    await flowkit.replay_async(full, Evolving)
    with pytest.raises(flowkit.HistoryError):
        await flowkit.replay_async(full, OrderFlow)


async def test_history_json_round_trips_byte_for_byte() -> None:
    _, full = await _record_evolving()
    raw = full.to_json()
    back = History.from_json(raw)
    assert back == full
    assert back.to_json() == raw
    assert History.from_json(raw.encode()).to_json() == raw
    assert back.types == full.types
    assert [e.at for e in back] == [e.at for e in full]


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "not json at all",
        "[1, 2, 3]",
        "{}",
        '{"format": "temporal.history/1", "run_id": "r", "events": []}',
        '{"format": "flowkit.history/1", "run_id": 5, "events": []}',
        '{"format": "flowkit.history/1", "run_id": "r", "events": []}',
        '{"format": "flowkit.history/1", "run_id": "r", "events": [{"type": "bogus"}]}',
        '{"format": "flowkit.history/1", "run_id": "r", "events": '
        '[{"type": "timer_fired", "seq": 1, "at": 0, "pos": "1"}]}',
        '{"format": "flowkit.history/1", "run_id": "r", "events": [{"type": "run_started", '
        '"seq": 2, "at": 0, "workflow": "w", "version": "1"}]}',
    ],
)
def test_history_from_json_rejects_garbage(raw: str) -> None:
    with pytest.raises(flowkit.HistoryError):
        History.from_json(raw)
