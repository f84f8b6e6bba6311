"""Property: any program of steps (some with ``compensate=``, some failing for good, some in a
``ctx.gather``, a failed one caught or not) followed by a failure, or a cancellation with
``compensate=True``, undoes every completed compensated step exactly once, in the reverse
order of their recorded completions, also when the worker crashes around the undos' records;
its history replays, and replays against a body whose undos changed diverge. (Kept apart from
``test_replay_property.py``, whose grammar the other ops of issue #21 extend.)"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit import RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit.events import CompensationCompleted
from flowkit_testing import TestEnv

# A program (the workflow input, so replay sees it too) is a list of ops:
#   ["step", label, is_async, compensated, fails] | ["gather", [step ops]]
# then the body sleeps an hour (cancel it there) and fails.

RETRY = RetryPolicy(max_attempts=2, initial_interval=1.0)


class _SagaBody:
    other_undo = False

    def __init__(self) -> None:
        self.execs: Counter[str] = Counter()
        self.undone: list[str] = []
        self.flaky_undo: set[str] = set()

    def work(self, label: str, fails: bool) -> str:
        self.execs[label] += 1
        if fails:
            raise ValueError(f"{label} fails")
        return label

    async def awork(self, label: str, fails: bool) -> str:
        return self.work(label, fails)

    def undo(self, label: str) -> str:
        self.undone.append(label)
        if label in self.flaky_undo and self.undone.count(label) == 1:
            raise ConnectionError("undo busy")  # (retried by its step's policy)
        return f"undid {label}"

    def redo(self, label: str) -> None:  # pragma: no cover - replay never calls it
        pass

    async def _step(self, ctx: WorkflowCtx, op: list[Any]) -> Any:
        _, label, is_async, compensated, fails = op
        undo = (self.redo if self.other_undo else self.undo) if compensated else None
        fn = self.awork if is_async else self.work
        with contextlib.suppress(flowkit.StepFailedError):  # (a failed step is caught)
            return await ctx.step(fn, label, fails, compensate=undo, retry=RETRY)
        return None

    async def run(self, ctx: WorkflowCtx, prog: list[Any]) -> None:
        for op in prog:
            if op[0] == "gather":
                await ctx.gather(*(self._step(ctx, c) for c in op[1]))
            else:
                await self._step(ctx, op)
        await ctx.sleep(3600)
        raise RuntimeError("the saga failed")


@workflow(name="saga")
class Saga(_SagaBody):
    pass


@workflow(name="saga")
class OtherUndo(_SagaBody):
    other_undo = True


@st.composite
def programs(draw: st.DrawFn) -> list[Any]:
    n = 0

    def step() -> list[Any]:
        nonlocal n
        n += 1
        return [
            "step",
            f"s{n}",
            draw(st.booleans()),
            draw(st.booleans()),
            draw(st.integers(0, 4)) == 0,
        ]

    prog: list[Any] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 3)) == 0:
            prog.append(["gather", [step() for _ in range(draw(st.integers(1, 3)))]])
        else:
            prog.append(step())
    return prog


def _steps(prog: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for op in prog:
        out.extend(op[1] if op[0] == "gather" else [op])
    return out


async def _check(prog: list[Any], cancel: bool, crash: str | None, flaky: bool) -> None:
    wf = Saga()
    steps = _steps(prog)
    undone = [op[1] for op in steps if op[3] and not op[4]]
    if flaky and undone:
        wf.flaky_undo.add(undone[0])
    async with TestEnv([wf], seed=len(prog)) as env:
        if crash is not None:
            env.crash_at(0, crash)
        await env.start("saga", prog, "s")
        if cancel:
            await env.advance(60)
            if not env.crashed:
                await env.cancel("s", compensate=True)
        for _ in range(50):
            if env.crashed:
                await env.restart(0)
                continue
            await env.run_until_idle()
            if not env.crashed and (await env.get_run("s")).status.terminal:
                break
        run = await env.get_run("s")
        assert run.status is (RunStatus.CANCELLED if cancel else RunStatus.FAILED), run
        h = await env.history("s")
        assert [e.seq for e in h] == list(range(1, len(h) + 1))
        assert wf.execs == Counter({op[1]: 2 if op[4] else 1 for op in steps})  # (2 tries)
        done = sorted(
            (e for e in h if e.type == "step_completed"), key=lambda e: e.seq, reverse=True
        )
        by_pos = {e.pos: e.result for e in done}
        order = [e.result for e in done if e.result in undone]
        comps = [e for e in h if isinstance(e, CompensationCompleted)]
        assert [by_pos[e.step_pos] for e in comps] == order
        assert [e.pos for e in comps] == [f"c{i}" for i in range(1, len(comps) + 1)]
        # each undo ran once (twice: the flaky one, or the one a crash lost before its record)
        extra = Counter(wf.undone) - Counter(order)
        assert sum(extra.values()) <= (1 if flaky else 0) + (
            1 if crash == "before_compensation_record" else 0
        )
        await flowkit.replay_async(h, Saga)
        assert flowkit.History.from_json(h.to_json()) == h
        if order:
            with pytest.raises(flowkit.NonDeterminismError):
                await flowkit.replay_async(h, OtherUndo)
    gc.collect()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prog=programs(),
    cancel=st.booleans(),
    crash=st.sampled_from([None, "before_compensation_record", "after_compensation_record"]),
    flaky=st.booleans(),
)
async def test_random_sagas_undo_each_completed_step_once_in_reverse(
    prog: list[Any], cancel: bool, crash: str | None, flaky: bool
) -> None:
    await _check(prog, cancel, crash, flaky)


async def test_fixed_saga_covers_every_op() -> None:
    prog = [
        ["step", "s1", False, True, False],
        ["gather", [["step", "s2", True, True, False], ["step", "s3", False, False, False]]],
        ["step", "s4", True, True, True],
        ["step", "s5", False, True, False],
    ]
    await _check(prog, cancel=False, crash="before_compensation_record", flaky=True)
    await _check(prog, cancel=True, crash="after_compensation_record", flaky=False)
