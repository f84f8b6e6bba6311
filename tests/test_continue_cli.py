"""``flowkit show`` and ``flowkit history`` on a continue-as-new chain (a real SQLite file, the
command in a child process)."""

from __future__ import annotations

from pathlib import Path

from cli_kit import flowkit

from flowkit import WorkflowCtx, workflow
from flowkit.stores import SqlStore
from flowkit_testing import TestEnv


@workflow(name="cycle")
class Cycle:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        if n < 2:
            ctx.continue_as_new(n + 1)
        return n


async def test_show_and_history_of_a_chain(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    store = SqlStore(url)
    try:
        async with TestEnv([Cycle()], store=store) as env:
            await env.start("cycle", 0, "cy")
            assert await env.result("cy") == 2
    finally:
        store.close()
    first = flowkit(tmp_path, "--db", url, "show", "cy")
    assert first.returncode == 0, first.stderr
    assert "continued as cy~1" in first.stdout and "continued from" not in first.stdout
    middle = flowkit(tmp_path, "--db", url, "show", "cy~1")
    assert "continued from cy\n" in middle.stdout and "continued as cy~2" in middle.stdout
    last = flowkit(tmp_path, "--db", url, "show", "cy~2")
    assert "continued from cy~1" in last.stdout and "continued as" not in last.stdout
    assert "output  2" in last.stdout
    hist = flowkit(tmp_path, "--db", url, "history", "cy~1")
    assert hist.returncode == 0, hist.stderr
    line = next(ln for ln in hist.stdout.splitlines() if "run_continued" in ln)
    assert "continued as cy~2 input 2" in line
