"""The ``flowkit`` command against a real SQLite file, run as a user would (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flowkit import Engine, History, SystemClock
from flowkit.stores import SqlStore

WF_SOURCE = textwrap.dedent(
    """
    from flowkit import WorkflowCtx, workflow

    def double(x: int) -> int:
        return 2 * x

    def triple(x: int) -> int:
        return 3 * x

    @workflow(name="cli-demo")
    class CliDemo:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(double, input)

    @workflow(name="cli-demo")
    class CliDemoChanged:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(triple, input)
    """
)


def flowkit(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flowkit.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200", "PYTHONPATH": str(tmp)},
    )


@pytest.fixture
async def db(tmp_path: Path) -> str:
    (tmp_path / "cliwf.py").write_text(WF_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import cliwf

        url = f"sqlite:///{tmp_path / 'flowkit.db'}"
        async with Engine(SqlStore(url), [cliwf.CliDemo()], clock=SystemClock()) as engine:
            await engine.start("cli-demo", 21, "run-1")
            assert await engine.result("run-1", timeout=10) == 42
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("cliwf", None)
    return url


async def test_runs_show_and_history(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "runs")
    assert out.returncode == 0, out.stderr
    assert "run-1" in out.stdout and "completed" in out.stdout
    out = flowkit(tmp_path, "--db", db, "show", "run-1")
    assert out.returncode == 0 and "output  42" in out.stdout
    out = flowkit(tmp_path, "--db", db, "history", "run-1")
    assert out.returncode == 0
    assert "run_started" in out.stdout and "run_completed" in out.stdout
    out = flowkit(tmp_path, "--db", db, "history", "run-1", "--json")
    hist = History.from_json(out.stdout)
    assert hist.types == ["run_started", "step_completed", "run_completed"]
    assert json.loads(out.stdout)["run_id"] == "run-1"


async def test_replay_exit_codes(db: str, tmp_path: Path) -> None:
    out = flowkit(tmp_path, "--db", db, "history", "run-1", "--json")
    (tmp_path / "h.json").write_text(out.stdout)
    ok = flowkit(tmp_path, "replay", "h.json", "--workflow", "cliwf:CliDemo")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = flowkit(tmp_path, "replay", "h.json", "--workflow", "cliwf:CliDemoChanged")
    assert bad.returncode == 1
    assert "double" in bad.stdout and "triple" in bad.stdout


async def test_errors_are_one_line(db: str, tmp_path: Path) -> None:
    for args in (
        ("--db", db, "show", "nope"),
        ("--db", f"sqlite:///{tmp_path / 'missing.db'}", "runs"),
        ("replay", "missing.json", "--workflow", "cliwf:CliDemo"),
        ("replay", "cliwf.py", "--workflow", "cliwf:CliDemo"),
        ("replay", "h.json", "--workflow", "nomodule:X"),
    ):
        (tmp_path / "h.json").write_text("{}")
        out = flowkit(tmp_path, *args)
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith("flowkit: error:")
