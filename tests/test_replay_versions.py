"""Replaying the histories of several versions of one workflow (docs/debugging.md, "Golden
histories in CI"; docs/cli.md, "flowkit replay"): each history replays against the class of the
version it was recorded on, as a worker would resume it; a history whose version the code given
lacks is a ``VersionMismatchError`` naming the recorded and the available versions, never a
divergence (no worker replays a v1 history against v2 code).

The API (``replay``, ``replay_dir``) and the ``flowkit replay`` command (a subprocess)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from cli_kit import flowkit

from flowkit import (
    NonDeterminismError,
    VersionMismatchError,
    WorkflowNotFoundError,
    replay,
    replay_async,
    replay_dir,
)
from flowkit_testing import TestEnv

SOURCE = textwrap.dedent(
    """
    from flowkit import WorkflowCtx, workflow

    def add_one(x: int) -> int:
        return x + 1

    def times_ten(x: int) -> int:
        return x * 10

    @workflow(name="billing", version="1")
    class BillingV1:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(add_one, input)

    @workflow(name="billing", version="2")
    class BillingV2:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(times_ten, input)

    @workflow(name="billing", version="10")
    class BillingV10:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(times_ten, input) + 1

    @workflow(name="billing", version="2")
    class BillingV2Changed:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            return await ctx.step(add_one, input)
    """
)


@pytest.fixture
def mod(tmp_path: Path) -> Iterator[ModuleType]:
    """The workflows above as the module ``billingwf`` in ``tmp_path`` (for the CLI too)."""
    (tmp_path / "billingwf.py").write_text(SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("billingwf")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("billingwf", None)


@pytest.fixture
async def golden(mod: ModuleType, tmp_path: Path) -> Path:
    """``histories/``: a run of version 1 (``b-1.json``) and one of version 2 (``b-2.json``)."""
    directory = tmp_path / "histories"
    directory.mkdir()
    async with TestEnv([mod.BillingV1(), mod.BillingV2()]) as env:
        for run_id, version in (("b-1", "1"), ("b-2", "2")):
            await env.start("billing", 4, run_id, version=version)
            await env.result(run_id)
            (directory / f"{run_id}.json").write_text((await env.history(run_id)).to_json())
    return directory


# -- the API ----------------------------------------------------------------------------------


async def test_replay_against_another_version_is_a_version_mismatch(
    mod: ModuleType, golden: Path
) -> None:
    """Before anything replays: a typed error naming both versions, not a divergence."""
    from flowkit import History

    h1 = History.from_json((golden / "b-1.json").read_text())
    await replay_async(h1, mod.BillingV1)  # its own version replays
    with pytest.raises(VersionMismatchError) as caught:
        await replay_async(h1, mod.BillingV2)
    err = caught.value
    assert isinstance(err, WorkflowNotFoundError) and not isinstance(err, NonDeterminismError)
    assert (err.workflow, err.version, err.available) == ("billing", "1", ("2",))
    assert str(err) == (
        "the history of workflow 'billing' was recorded on version '1', and the code given "
        "has version '2': replay it against the class of version '1' (a run resumes only on "
        "the version it started on)"
    )


def test_the_sync_replay_checks_the_version_too(mod: ModuleType, golden: Path) -> None:
    raw = (golden / "b-2.json").read_text()
    replay(raw, mod.BillingV2())
    with pytest.raises(VersionMismatchError, match="recorded on version '2'"):
        replay(raw, mod.BillingV10())


def test_replay_dir_replays_each_history_against_its_own_version(
    mod: ModuleType, golden: Path
) -> None:
    report = replay_dir(golden, [mod.BillingV2(), mod.BillingV1, mod.BillingV10])
    assert report.passed, report.summary()
    assert [(r.path.name, r.version) for r in report.results] == [
        ("b-1.json", "1"),
        ("b-2.json", "2"),
    ]


def test_replay_dir_reports_a_version_not_given(mod: ModuleType, golden: Path) -> None:
    """The v1 history is an error that names the versions given, in natural order; the v2
    one still replays; a real divergence of v2 is still a divergence."""
    report = replay_dir(golden, [mod.BillingV10, mod.BillingV2])
    (b1, b2) = report.results
    assert b1.status == "error" and isinstance(b1.error, VersionMismatchError)
    assert b1.error.available == ("2", "10")
    assert "recorded on version '1'" in b1.describe()
    assert "the code given has versions '2', '10'" in b1.describe()
    assert b2.ok
    changed = replay_dir(golden, [mod.BillingV1, mod.BillingV2Changed])
    assert [r.status for r in changed.results] == ["ok", "diverged"]


def test_one_version_given_twice_is_refused(mod: ModuleType, golden: Path) -> None:
    with pytest.raises(ValueError, match="two workflows named 'billing' of version '2'"):
        replay_dir(golden, [mod.BillingV2, mod.BillingV2Changed])


# -- flowkit replay ---------------------------------------------------------------------------


def test_cli_replays_a_directory_of_two_versions(mod: ModuleType, golden: Path) -> None:
    tmp = golden.parent
    out = flowkit(
        tmp, "replay", "histories", "--workflow", "billingwf:BillingV1",
        "--workflow", "billingwf:BillingV2",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == "2 histories in histories: 2 ok, 0 diverged, 0 errors"


def test_cli_names_the_missing_version_of_a_directory(mod: ModuleType, golden: Path) -> None:
    tmp = golden.parent
    out = flowkit(tmp, "replay", "histories", "--workflow", "billingwf:BillingV2")
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("error     b-1.json (run 'b-1', workflow 'billing', 3 events): ")
    assert "recorded on version '1'" in lines[0] and "has version '2'" in lines[0]
    assert "non-deterministic" not in out.stdout and "patch" not in out.stdout
    assert lines[1].startswith("ok        b-2.json")
    assert lines[-1] == "2 histories in histories: 1 ok, 0 diverged, 1 error"


def test_cli_replays_a_file_against_its_own_version(mod: ModuleType, golden: Path) -> None:
    """Of several ``--workflow`` versions the history's own is taken, whatever the order; a
    file whose version none gives is a one-line error naming both (exit 2), not a
    divergence (exit 1)."""
    tmp = golden.parent
    ok = flowkit(
        tmp, "replay", "histories/b-1.json", "--workflow", "billingwf:BillingV2",
        "--workflow", "billingwf:BillingV1",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip() == "ok: 3 events of 'b-1' replay"
    bad = flowkit(tmp, "replay", "histories/b-1.json", "--workflow", "billingwf:BillingV2")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith("flowkit: error: the history of workflow 'billing' was recorded on")
    assert "version '1'" in line and "has version '2'" in line
