"""``flowkit history`` and ``flowkit replay`` with patch markers, against a real SQLite file,
run as a user would (subprocess)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from cli_kit import flowkit

from flowkit import Engine, History, SystemClock
from flowkit.stores import SqlStore

WF_SOURCE = textwrap.dedent(
    """
    from flowkit import WorkflowCtx, workflow

    def charge(cents: int) -> int:
        return cents

    def charge_with_fee(cents: int) -> int:
        return cents + 5

    @workflow(name="fees")
    class FeesV1:
        async def run(self, ctx: WorkflowCtx, cents: int) -> int:
            return await ctx.step(charge, cents)

    @workflow(name="fees")
    class FeesPatched:
        async def run(self, ctx: WorkflowCtx, cents: int) -> int:
            if ctx.patched("fee"):
                return await ctx.step(charge_with_fee, cents)
            return await ctx.step(charge, cents)
    """
)


@pytest.fixture
async def db(tmp_path: Path) -> str:
    """A SQLite file with ``old`` (run by ``FeesV1``) and ``new`` (by ``FeesPatched``)."""
    (tmp_path / "feeswf.py").write_text(WF_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import feeswf

        url = f"sqlite:///{tmp_path / 'flowkit.db'}"
        for code, run_id in ((feeswf.FeesV1(), "old"), (feeswf.FeesPatched(), "new")):
            async with Engine(SqlStore(url), [code], clock=SystemClock()) as engine:
                await engine.start("fees", 100, run_id)
                await engine.result(run_id, timeout=10)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("feeswf", None)
    return url


async def test_history_prints_the_marker_and_replay_names_the_patches(
    db: str, tmp_path: Path
) -> None:
    out = flowkit(tmp_path, "--db", db, "history", "new")
    assert out.returncode == 0, out.stderr
    marker = next(line for line in out.stdout.splitlines() if "patch_marker" in line)
    assert marker.split()[2:] == ["-", "patch_marker", "took", "patch", "fee"]  # no position

    golden = tmp_path / "golden"
    golden.mkdir()
    for run_id in ("old", "new"):
        raw = flowkit(tmp_path, "--db", db, "history", run_id, "--json").stdout
        h = History.from_json(raw)
        assert History.from_json(h.to_json()) == h
        (golden / f"{run_id}.json").write_text(raw)
    assert History.from_json((golden / "new.json").read_text()).types[1] == "patch_marker"

    one = flowkit(tmp_path, "replay", "golden/new.json", "--workflow", "feeswf:FeesPatched")
    assert one.returncode == 0, one.stdout + one.stderr
    assert one.stdout.strip().endswith("of 'new' replay, patch 'fee'")
    both = flowkit(tmp_path, "replay", "golden", "--workflow", "feeswf:FeesPatched")
    assert both.returncode == 0, both.stdout + both.stderr
    lines = both.stdout.splitlines()
    assert lines[0].startswith("ok") and "4 events, patch 'fee')" in lines[0]  # new.json
    assert lines[1].startswith("ok") and "patch" not in lines[1]  # old.json

    bad = flowkit(tmp_path, "replay", "golden", "--workflow", "feeswf:FeesV1")
    assert bad.returncode == 1
    assert "diverged  new.json" in bad.stdout and "ok        old.json" in bad.stdout
    assert "the history took patch 'fee'" in bad.stdout
