"""Piped ``flowkit`` output keeps its promise of one line per row when a run failed with a
pydantic ``ValidationError`` (a message of several lines), on a real SQLite file, the command
run as a user runs it (subprocess): ``runs``, ``show``, ``history`` and ``replay``'s
divergence report. A newline inside a message is printed as ``\\n``."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from cli_kit import flowkit

from flowkit import Engine, SystemClock, WorkflowFailedError
from flowkit.stores import SqlStore

WF_SOURCE = textwrap.dedent(
    """
    from pydantic import BaseModel

    from flowkit import RetryPolicy, Singleton, WorkflowCtx, workflow

    class Order(BaseModel):
        id: str
        cents: int

    class Shipped(BaseModel):
        id: str
        parcel: str

    def parse(raw: dict) -> dict:
        return Order.model_validate(raw).model_dump()

    def echo(raw: dict) -> dict:
        return raw

    def same(text: str) -> str:
        return text

    @workflow(name="parse-step")
    class ParseStep:
        async def run(self, ctx: WorkflowCtx, input: dict) -> dict:
            twice = RetryPolicy(max_attempts=2, initial_interval=0)
            return await ctx.step(parse, input, retry=twice)

    @workflow(name="parse-body")
    class ParseBody:
        async def run(self, ctx: WorkflowCtx, input: dict) -> dict:
            return Order.model_validate(input).model_dump()

    @workflow(name="ship")
    class Ship:
        async def run(self, ctx: WorkflowCtx, input: dict) -> dict:
            return await ctx.step(echo, input)

    @workflow(name="ship")
    class ShipStrict:
        # a deploy that now validates the step's result: a recorded completed run fails
        async def run(self, ctx: WorkflowCtx, input: dict) -> dict:
            return Shipped.model_validate(await ctx.step(echo, input)).model_dump()

    @workflow(name="keyed", singleton=Singleton(key=lambda inp: inp))
    class Keyed:
        async def run(self, ctx: WorkflowCtx, input: str) -> str:
            return await ctx.step(same, input)
    """
)

BAD = {"id": 7, "cents": "lots"}  # two validation errors: a message of seven lines


def rows(stdout: str) -> list[str]:
    """The output's lines, by every line boundary Python knows (not only ``\\n``)."""
    assert stdout.endswith("\n") and stdout.count("\n") == len(stdout.splitlines()), stdout
    return stdout.splitlines()


@pytest.fixture
def wfmod(tmp_path: Path) -> Iterator[ModuleType]:
    """The workflow module, importable here (for the test's engine) and in the subprocess."""
    (tmp_path / "onelinewf.py").write_text(WF_SOURCE)
    sys.path.insert(0, str(tmp_path))
    try:
        import onelinewf

        yield onelinewf
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("onelinewf", None)


async def failed_runs(wfmod: ModuleType, url: str) -> dict[str, dict[str, str]]:
    """A run whose step raised a ``ValidationError`` (twice) and one whose body did; their
    stored errors, which hold newlines."""
    workflows = [wfmod.ParseStep(), wfmod.ParseBody(), wfmod.Ship()]
    async with Engine(SqlStore(url), workflows, clock=SystemClock()) as engine:
        await engine.start("parse-step", BAD, "in-step")
        await engine.start("parse-body", BAD, "in-body")
        await engine.start("ship", {"id": "o-1", "cents": 5}, "shipped")
        for run_id in ("in-step", "in-body"):
            with pytest.raises(WorkflowFailedError):
                await engine.result(run_id, timeout=10)
        assert await engine.result("shipped", timeout=10) == {"id": "o-1", "cents": 5}
        errors = {r: (await engine.get_run(r)).error for r in ("in-step", "in-body")}
    for error in errors.values():
        assert error is not None and "ValidationError" in error["message"] + error["type"]
        assert error["message"].count("\n") >= 6, error  # the precondition: several lines
    return {r: e for r, e in errors.items() if e is not None}


async def test_a_validation_error_stays_on_its_row(wfmod: ModuleType, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    errors = await failed_runs(wfmod, url)

    out = flowkit(tmp_path, "--db", url, "runs")
    assert out.returncode == 0, out.stderr
    lines = rows(out.stdout)
    assert len(lines) == 1 + 3  # the header, one line per run
    assert [ln.split()[0] for ln in lines[1:]] == ["in-step", "in-body", "shipped"]

    for run_id, error in errors.items():
        out = flowkit(tmp_path, "--db", url, "show", run_id)
        assert out.returncode == 0, out.stderr
        lines = rows(out.stdout)
        # the run, its times, the input, the error: one line each
        assert [ln.split()[0] for ln in lines] == [run_id, "created", "input", "error"], lines
        whole = f"{error['type']}: {error['message']}"
        assert lines[3] == "  error   " + whole.replace("\n", "\\n")

        out = flowkit(tmp_path, "--db", url, "history", run_id)
        assert out.returncode == 0, out.stderr
        lines = rows(out.stdout)
        async with Engine(SqlStore(url), worker=False) as client:
            history = await client.history(run_id)
        assert len(lines) == 1 + len(history), lines  # the header, one line per event
        assert [ln.split()[0] for ln in lines[1:]] == [str(ev.seq) for ev in history]
        assert [ln.split()[3] for ln in lines[1:]] == history.types
        assert lines[-1].endswith(whole.replace("\n", "\\n"))  # run_failed, whole
    timeline = rows(flowkit(tmp_path, "--db", url, "history", "in-step").stdout)
    attempts = [ln for ln in timeline if " step_failed " in ln]
    assert len(attempts) == 2
    assert all("ValidationError: 2 validation errors for Order\\nid\\n" in ln for ln in attempts)
    assert '\\"' not in "".join(attempts)  # the message is text, not a JSON string


async def test_a_divergence_whose_message_holds_a_validation_error(
    wfmod: ModuleType, tmp_path: Path
) -> None:
    """A recorded completed run that the changed code fails with a ``ValidationError``: the
    divergence report's first line carries the failure, on one line; one file per line in a
    directory's replay, its report indented below it."""
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    await failed_runs(wfmod, url)
    raw = flowkit(tmp_path, "--db", url, "history", "shipped", "--json").stdout
    golden = tmp_path / "golden"
    golden.mkdir()
    (golden / "shipped.json").write_text(raw)
    for run_id in ("in-step", "in-body"):
        exported = flowkit(tmp_path, "--db", url, "history", run_id, "--json").stdout
        (golden / f"{run_id}.json").write_text(exported)

    ok = flowkit(tmp_path, "replay", "golden/shipped.json", "--workflow", "onelinewf:Ship")
    assert ok.returncode == 0 and rows(ok.stdout) == ["ok: 3 events of 'shipped' replay"]

    bad = flowkit(tmp_path, "replay", "golden/shipped.json", "--workflow", "onelinewf:ShipStrict")
    assert bad.returncode == 1, bad.stderr
    lines = rows(bad.stdout)
    assert lines[0].startswith("diverged: non-deterministic workflow at position end: ")
    failure = "code called failure ValidationError: 1 validation error for Shipped\\nparcel\\n"
    assert failure in lines[0], lines
    assert len(lines) == 1, lines  # a divergence at the end has no events around it to list

    spec = ["--workflow", "onelinewf:ShipStrict", "--workflow", "onelinewf:ParseStep"]
    out = flowkit(tmp_path, "replay", "golden", *spec, "--workflow", "onelinewf:ParseBody")
    assert out.returncode == 1, out.stderr
    lines = rows(out.stdout)
    files = [ln for ln in lines if not ln.startswith(" ")]
    assert [ln.split()[:2] for ln in files[:-1]] == [
        ["ok", "in-body.json"],
        ["ok", "in-step.json"],
        ["diverged", "shipped.json"],
    ]
    assert files[-1].endswith("2 ok, 1 diverged, 0 errors")
    report = lines[lines.index(files[2]) + 1 : -1]
    assert report[0].startswith("    non-deterministic workflow at position end: ")
    assert "ValidationError: 1 validation error for Shipped\\nparcel\\n" in report[0]
    assert len(report) == 1, report


async def test_a_newline_in_a_key_stays_inside_its_cell(wfmod: ModuleType, tmp_path: Path) -> None:
    """Any stored text may hold a newline (a singleton key a key function built from input):
    piped, each run is still one line of ``runs`` and each event one line of ``history``."""
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    async with Engine(SqlStore(url), [wfmod.Keyed()], clock=SystemClock()) as engine:
        await engine.start("keyed", "shop\nnorth\r\u2028west", "keyed-1")
        assert await engine.result("keyed-1", timeout=10) == "shop\nnorth\r\u2028west"
        history = await engine.history("keyed-1")

    out = flowkit(tmp_path, "--db", url, "runs")
    lines = rows(out.stdout)
    assert len(lines) == 2 and lines[1].split()[:4] == [
        "keyed-1", "keyed", "completed", "shop\\nnorth\\r\\u2028west"
    ], lines  # fmt: skip
    lines = rows(flowkit(tmp_path, "--db", url, "history", "keyed-1").stdout)
    assert len(lines) == 1 + len(history)
    assert "key shop\\nnorth\\r\\u2028west" in lines[2]
    lines = rows(flowkit(tmp_path, "--db", url, "show", "keyed-1").stdout)
    assert "  singleton shop\\nnorth\\r\\u2028west" in lines
