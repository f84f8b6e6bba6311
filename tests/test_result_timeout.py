"""``Engine.result(timeout=...)`` says which run, its status and the likely cause."""

from __future__ import annotations

import pytest

import flowkit
from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import MemoryStore


@workflow(name="greet")
class Greet:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.wait_for_signal("go") if input == "wait" else f"hi {input}"


async def test_result_on_an_engine_never_entered_names_the_run_and_the_cause() -> None:
    engine = Engine(MemoryStore(), [Greet()])  # no ``async with``: no worker runs
    await engine.start("greet", "ada", "welcome-ada")
    with pytest.raises(flowkit.ResultTimeoutError) as info:
        await engine.result("welcome-ada", timeout=0.05)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, flowkit.FlowkitError)
    assert (err.run_id, err.status, err.timeout) == ("welcome-ada", "pending", 0.05)
    text = str(err)
    assert "'welcome-ada'" in text and "'pending'" in text
    assert "worker is not running" in text and "async with engine" in text


async def test_result_timeout_of_a_waiting_run_says_what_it_waits_for() -> None:
    async with Engine(MemoryStore(), [Greet()]) as engine:
        await engine.start("greet", "wait", "w")
        with pytest.raises(flowkit.ResultTimeoutError, match="signal\\(s\\) go") as info:
            await engine.result("w", timeout=0.05)
        assert info.value.status == "suspended"
        await engine.signal("w", "go", "done")
        assert await engine.result("w", timeout=5) == "done"


async def test_result_of_an_unknown_run_is_not_a_timeout() -> None:
    async with Engine(MemoryStore(), [Greet()]) as engine:
        with pytest.raises(flowkit.RunNotFoundError):
            await engine.result("nope", timeout=0.05)
