"""``flowkit show`` names a run's parent and lists its children; ``flowkit history`` prints
the child events (a real SQLite file, the command run as a user would)."""

from __future__ import annotations

from pathlib import Path

from cli_kit import flowkit

from flowkit import ChildWorkflowError, Engine, SystemClock, WorkflowCtx, workflow
from flowkit.stores import SqlStore


@workflow(name="cli-kid")
class Kid:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        if input < 0:
            raise ValueError("negative")
        return input * 10


@workflow(name="cli-parent")
class Parent:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        total = await ctx.child(Kid, input)
        try:
            await ctx.child(Kid, -1)
        except ChildWorkflowError:
            total += 1
        try:
            await ctx.child("cli-kid", "not a number")
        except ChildWorkflowError:
            total += 1
        return total


async def test_show_lists_children_and_parent_and_history_prints_child_events(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [Parent(), Kid()], clock=SystemClock()) as engine:
        await engine.start("cli-parent", 4, "p")
        assert await engine.result("p", timeout=10) == 42
    out = flowkit(tmp_path, "--db", url, "show", "p")
    assert out.returncode == 0, out.stderr
    assert "child   p.child.1  cli-kid v1  [completed]" in out.stdout
    assert "child   p.child.2  cli-kid v1  [failed]" in out.stdout
    assert "p.child.3" not in out.stdout  # never started: no run
    assert "  parent  " not in out.stdout
    out = flowkit(tmp_path, "--db", url, "show", "p.child.1")
    assert out.returncode == 0 and "parent  p" in out.stdout
    out = flowkit(tmp_path, "--db", url, "history", "p")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any("child_started" in ln and "p.child.1 (cli-kid v1)" in ln for ln in lines)
    assert any("child_completed" in ln and "p.child.1 -> 40" in ln for ln in lines)
    assert any("child_failed" in ln and "p.child.2" in ln and "ValueError" in ln for ln in lines)
    assert any(
        "child_failed" in ln and "p.child.3 (never started) InvalidInputError" in ln for ln in lines
    )
