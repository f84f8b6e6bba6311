"""Property: any program of steps, sleeps, signal waits, patches, child runs, gathers and
continue-as-new runs to completion in a TestEnv (a chain of runs, one per segment between
continuations), executes each step exactly once, records gap-free histories, and replays
cleanly; a body that renames its steps does not. Patches: the history replays against the
deprecate and removal deploys of its patches, and the same history recorded before the
patches existed (without markers) replays against the patched code, every patch False."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flowkit
from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit.events import PatchMarker, RunCompleted
from flowkit_testing import TestEnv

# A program is a JSON list of ops (it is the workflow input, so replay sees it too):
#   ["step", label, is_async] | ["sleep", seconds] | ["signal", name, send_early]
#   | ["patch", patch_id] (the value of ctx.patched) | ["gather", wrapped, [leaf ops]]
#   | ["continue"] (ctx.continue_as_new with the rest of the program: a run per segment)
#   | ["child", label, fails] (ctx.child of Kid: its label, or "failed" when it fails)
#   | ["start_child", label] (ctx.start_child of Kid, then its handle's result: its label)
#   (wrapped: children are coroutines calling ctx, else the ctx awaitables themselves; a
#   patch, not awaitable, is a coroutine of its own either way)


@workflow(name="program-kid")
class Kid:
    """A child of the programs: sleeps a second, then returns its label or fails."""

    async def run(self, ctx: WorkflowCtx, input: list[Any]) -> str:
        await ctx.sleep(1)
        if input[1]:
            raise ValueError(f"{input[0]} fails")
        return str(input[0])


class _ProgramBody:
    mutate = False
    # what a "patch" op does: "patched" (the patch deploy), "deprecated" (ctx.deprecate_patch,
    # then the new branch: True), "removed" (no call: True)
    patches = "patched"

    def __init__(self) -> None:
        self.execs: Counter[str] = Counter()

    def work(self, label: str) -> str:
        self.execs[label] += 1
        return label

    async def awork(self, label: str) -> str:
        self.execs[label] += 1
        await asyncio.sleep(0)
        return label

    async def _patch(self, ctx: WorkflowCtx, patch_id: str) -> bool:
        if self.patches == "patched":
            return ctx.patched(patch_id)
        if self.patches == "deprecated":
            ctx.deprecate_patch(patch_id)
        return True

    def _leaf(self, ctx: WorkflowCtx, op: list[Any]) -> Any:
        kind = op[0]
        if kind == "patch":
            return self._patch(ctx, op[1])
        if kind in ("child", "start_child"):  # (a coroutine of its own either way)
            return self._child(ctx, op)
        if kind == "step":
            fn = self.awork if op[2] else self.work
            return ctx.step(fn, op[1], name="mutant" if self.mutate else None)
        if kind == "sleep":
            return ctx.sleep(op[1])
        assert kind == "signal"
        return ctx.wait_for_signal(op[1])

    async def _child(self, ctx: WorkflowCtx, op: list[Any]) -> str:
        if op[0] == "start_child":
            handle = await ctx.start_child(Kid, [op[1], False])
            return str(await handle.result())
        try:
            return str(await ctx.child(Kid, [op[1], op[2]]))
        except flowkit.ChildWorkflowError:
            return "failed"

    async def _wrapped(self, ctx: WorkflowCtx, op: list[Any]) -> Any:
        return await self._leaf(ctx, op)

    async def run(self, ctx: WorkflowCtx, input: list[Any]) -> list[Any]:
        out: list[Any] = []
        for k, op in enumerate(input):
            if op[0] == "continue":
                ctx.continue_as_new(input[k + 1 :])
            if op[0] == "gather":
                wrapped, children = op[1], op[2]
                aws = [self._wrapped(ctx, c) if wrapped else self._leaf(ctx, c) for c in children]
                out.append(await ctx.gather(*aws))
            else:
                out.append(await self._leaf(ctx, op))
        return out


@workflow(name="program")
class Program(_ProgramBody):
    pass


@workflow(name="program")
class RenamedSteps(_ProgramBody):
    mutate = True


@workflow(name="program")
class DeprecatedPatches(_ProgramBody):
    patches = "deprecated"


@workflow(name="program")
class RemovedPatches(_ProgramBody):
    patches = "removed"


_leaf_kind = st.sampled_from(["step", "sleep", "signal", "patch", "child", "start_child"])


@st.composite
def programs(draw: st.DrawFn, continues: bool = False) -> list[Any]:
    """A random program; with ``continues``, some top-level ops are ``["continue"]``."""
    counter = {"step": 0, "signal": 0, "child": 0}

    def leaf() -> list[Any]:
        kind = draw(_leaf_kind)
        if kind == "sleep":
            return ["sleep", draw(st.sampled_from([0, 1, 5, 60, 86_400]))]
        if kind == "patch":  # (a few ids: some are asked more than once)
            return ["patch", draw(st.sampled_from(["p1", "p2", "p3"]))]
        if kind in ("child", "start_child"):
            counter["child"] += 1
            label = f"k{counter['child']}"
            return ["child", label, draw(st.booleans())] if kind == "child" else [kind, label]
        counter[kind] += 1
        if kind == "step":
            return ["step", f"s{counter['step']}", draw(st.booleans())]
        return ["signal", f"sig{counter['signal']}", draw(st.booleans())]

    prog: list[Any] = []
    for _ in range(draw(st.integers(0, 7))):
        if continues and draw(st.integers(0, 7)) == 0:
            prog.append(["continue"])
        elif draw(st.integers(0, 3)) == 0:
            children = [leaf() for _ in range(draw(st.integers(1, 4)))]
            prog.append(["gather", draw(st.booleans()), children])
        else:
            prog.append(leaf())
    return prog


def _leaves(prog: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for op in prog:
        if op[0] != "continue":
            out.extend(op[2] if op[0] == "gather" else [op])
    return out


def _segments(prog: list[Any]) -> list[list[Any]]:
    """The program of each run of the chain: split at its ``continue`` ops."""
    segs: list[list[Any]] = [[]]
    for op in prog:
        if op[0] == "continue":
            segs.append([])
        else:
            segs[-1].append(op)
    return segs


def _expected(prog: list[Any], patched: bool = True) -> list[Any]:
    def value(op: list[Any]) -> Any:
        if op[0] == "step":
            return op[1]
        if op[0] == "patch":
            return patched
        if op[0] == "signal":
            return f"{op[1]}-payload"
        if op[0] == "child":
            return "failed" if op[2] else op[1]
        if op[0] == "start_child":
            return op[1]
        return None

    return [[value(c) for c in op[2]] if op[0] == "gather" else value(op) for op in prog]


async def _chain(env: TestEnv, run_id: str) -> list[str]:
    """The ids of the chain that starts at ``run_id``, as far as it goes now."""
    ids = [run_id]
    run = await env.get_run(run_id)
    while run.continued_as is not None:
        ids.append(run.continued_as)
        run = await env.get_run(run.continued_as)
    return ids


async def _check_program(prog: list[Any]) -> None:
    wf = Program()
    leaves = _leaves(prog)
    segs = _segments(prog)
    signals = [op for op in leaves if op[0] == "signal"]
    early = [op for op in segs[0] if op[0] == "signal" and op[2]]  # (the first run's inbox)
    async with TestEnv([wf, Kid()], seed=len(prog)) as env:
        await env.start("program", prog, "prog")
        for sig in early:
            await env.signal("prog", sig[1], f"{sig[1]}-payload")
        pending = [sig for sig in signals if sig not in early]
        for _ in range(len(signals) + len(segs) + 2):
            await env.run_until_idle()
            current = (await _chain(env, "prog"))[-1]
            if (await env.get_run(current)).status is not RunStatus.SUSPENDED or not pending:
                break
            sig = pending.pop(0)
            await env.signal(current, sig[1], f"{sig[1]}-payload")
        ids = await _chain(env, "prog")
        assert len(ids) == len(segs)
        assert ids == ["prog", *(f"prog~{n}" for n in range(1, len(segs)))]
        run = await env.get_run(ids[-1])
        assert run.status is RunStatus.COMPLETED, (run.status, run.error)
        assert await env.engines[0].result("prog", timeout=5) == _expected(segs[-1])

        labels = [op[1] for op in leaves if op[0] == "step"]
        assert wf.execs == Counter(dict.fromkeys(labels, 1))
        types: Counter[str] = Counter()
        for n, (rid, seg) in enumerate(zip(ids, segs, strict=True)):
            h = await env.history(rid)
            types.update(h.types)
            assert [e.seq for e in h] == list(range(1, len(h) + 1))
            assert h.types[0] == "run_started" and h.types[-1] == "run_completed"
            assert h.types.count("run_continued") == (n < len(segs) - 1)
            seg_leaves = _leaves(seg)
            kids = [op for op in seg_leaves if op[0] in ("child", "start_child")]
            failing = sum(op[0] == "child" and op[2] for op in seg_leaves)
            assert h.types.count("child_started") == len(kids)
            assert h.types.count("child_completed") == len(kids) - failing
            assert h.types.count("child_failed") == failing
            assert len(await env.engines[0].list_runs(parent_id=rid)) == len(kids)
            patch_ids = [op[1] for op in seg_leaves if op[0] == "patch"]
            # one marker per patch (each activation asks again; the first one records it)
            markers = [e.patch_id for e in h if isinstance(e, PatchMarker)]
            assert sorted(markers) == sorted(set(patch_ids))

            await flowkit.replay_async(h, Program)
            assert flowkit.History.from_json(h.to_json()) == h
            await flowkit.replay_async(h, DeprecatedPatches)
            await flowkit.replay_async(h, RemovedPatches)
            if patch_ids:
                await flowkit.replay_async(_before_the_patches(h, seg), Program)
            if any(op[0] == "step" for op in seg_leaves):
                with pytest.raises(flowkit.NonDeterminismError):
                    await flowkit.replay_async(h, RenamedSteps)
        assert types["step_completed"] == len(labels)
        assert types["signal_received"] == len(signals)
        assert types["timer_fired"] == sum(op[0] == "sleep" for op in leaves)
    gc.collect()  # see conftest: keep abandoned-task finalizers out of later compiles


def _before_the_patches(h: flowkit.History, prog: list[Any]) -> flowkit.History:
    """The history the program records without its patches (the code before they existed):
    no markers (which never shifted a position), and every patch's value False (a run that
    continued as new has no output to change)."""
    events = [e for e in h if not isinstance(e, PatchMarker)]
    if "run_continued" not in h.types:
        events[-1] = RunCompleted(output=_expected(prog, patched=False), at=events[-1].at)
    return flowkit.History(
        h.run_id, [e.model_copy(update={"seq": i}) for i, e in enumerate(events, 1)]
    )


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(prog=programs(continues=True))
async def test_random_programs_run_once_and_replay(prog: list[Any]) -> None:
    await _check_program(prog)


async def test_fixed_program_covers_every_op() -> None:
    prog = [
        ["patch", "p1"],
        ["child", "k1", False],
        ["gather", False, [["child", "k2", True], ["start_child", "k3"], ["step", "s6", False]]],
        ["gather", True, [["start_child", "k4"], ["child", "k5", False]]],
        ["step", "s1", False],
        ["signal", "sig1", True],
        ["gather", True, [["step", "s2", True], ["sleep", 5], ["signal", "sig2", False]]],
        ["gather", False, [["patch", "p2"], ["sleep", 5], ["patch", "p3"]]],
        ["sleep", 60],
        ["gather", False, [["step", "s3", False], ["step", "s4", True], ["sleep", 1]]],
        ["signal", "sig3", False],
        ["step", "s5", True],
        ["patch", "p1"],
        ["continue"],
        ["signal", "sig4", False],
        ["patch", "p2"],
        ["continue"],
        ["step", "s7", False],
    ]
    await _check_program(prog)
