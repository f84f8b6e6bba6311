"""A step or a workflow body annotated ``-> NoReturn`` / ``-> Never`` (as Temporal's samples
annotate an activity that always raises): it has no result to validate, so it runs as a step
without a declared result type. It used to fail the run before the step ran, with a pydantic
schema error the body could not catch."""

from __future__ import annotations

from typing import Never, NoReturn

import pytest

import flowkit
from flowkit import RunStatus, StepFailedError, WorkflowCtx, workflow
from flowkit_testing import TestEnv

CALLS: list[str] = []


def refuse(order: str) -> NoReturn:
    CALLS.append(order)
    raise ValueError(f"order {order} refused")


async def refuse_later(order: str) -> Never:
    CALLS.append(order)
    raise LookupError(f"order {order} unknown")


@workflow(name="refuser")
class Refuser:
    async def run(self, ctx: WorkflowCtx, input: str) -> list[str]:
        caught = []
        for fn in (refuse, refuse_later):
            try:
                await ctx.step(fn, input)
            except StepFailedError as exc:
                caught.append(exc.error_type)
        return caught


async def test_a_step_that_never_returns_runs_and_its_failure_is_caught() -> None:
    CALLS.clear()
    async with TestEnv([Refuser()]) as env:
        await env.start("refuser", "o-1", "r1")
        assert await env.result("r1") == ["ValueError", "LookupError"]
        assert CALLS == ["o-1", "o-1"]  # both steps ran, once each
        h = await env.history("r1")
        assert h.types.count("step_failed") == 2
        CALLS.clear()
        await flowkit.replay_async(h, Refuser())  # replays from the record, calling nothing
        assert CALLS == []


async def test_a_body_annotated_no_return_is_a_workflow_like_any_other() -> None:
    @workflow(name="gives-up")
    class GivesUp:
        async def run(self, ctx: WorkflowCtx, input: str) -> NoReturn:
            await ctx.step(refuse, input)
            raise AssertionError("unreachable")  # (the step raises)

    async with TestEnv([GivesUp()]) as env:
        await env.start("gives-up", "o-2", "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as err:
            await env.result("r1")
        assert isinstance(err.value.cause, StepFailedError)
        assert (await env.get_run("r1")).status is RunStatus.FAILED
