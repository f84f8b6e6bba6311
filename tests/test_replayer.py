"""``replay_dir``: the CI regression test of workflow code against golden histories.

The first part is the pattern of docs/debugging.md ("Golden histories in CI"), made real: the
golden histories are recorded on the fly into ``tmp_path`` (a project commits them instead),
then the current code must replay all of them, and a breaking change is caught file by file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flowkit import (
    History,
    NonDeterminismError,
    ReplayFailedError,
    ReplayReport,
    WorkflowCtx,
    replay_dir,
    replay_dir_async,
    workflow,
)
from flowkit.errors import WorkflowNotFoundError
from flowkit_testing import TestEnv


class Catalog:
    async def price(self, sku: str) -> int:
        return {"pen": 3, "desk": 1200}.get(sku, 10)


@workflow(name="quote")
class Quote:
    """The code that produced the golden histories."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, ctx: WorkflowCtx, sku: str) -> int:
        price = await ctx.step(self.catalog.price, sku)
        if price > 1000:
            await ctx.sleep(3600)  # big quotes wait an hour before they are sent
        return price


@workflow(name="quote")
class QuoteReviewed:
    """A later change: big quotes now wait for a reviewer's signal instead of an hour.

    Runs of small quotes are unaffected; a big quote recorded by the old code would not replay."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, ctx: WorkflowCtx, sku: str) -> int:
        price = await ctx.step(self.catalog.price, sku)
        if price > 1000:
            await ctx.wait_for_signal("reviewed")
        return price


@workflow(name="greeting")
class Greeting:
    async def run(self, ctx: WorkflowCtx, name: str) -> str:
        return f"hello {name}"


async def run_and_record() -> dict[str, str]:
    """Run the current code once per input; return each run's history as JSON, by run id."""
    histories = {}
    async with TestEnv([Quote(Catalog()), Greeting()]) as env:
        for run_id, wf, inp in (
            ("quote-pen", "quote", "pen"),
            ("quote-desk", "quote", "desk"),
            ("greeting-ann", "greeting", "Ann"),
        ):
            await env.start(wf, inp, run_id)
            await env.result(run_id)
            histories[run_id] = (await env.history(run_id)).to_json()
    return histories


def record(directory: Path) -> Path:
    """Save the golden histories as ``<run id>.json`` (a project runs this once and commits
    the files; here every test records them afresh into ``tmp_path``)."""
    directory.mkdir(exist_ok=True)
    for run_id, raw in asyncio.run(run_and_record()).items():
        (directory / f"{run_id}.json").write_text(raw)
    return directory


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    return record(tmp_path / "histories")


# -- the documented pattern --------------------------------------------------------------------


def test_golden_histories_still_replay(golden: Path) -> None:
    replay_dir(golden, [Quote(Catalog()), Greeting]).raise_for_failures()


def test_a_breaking_change_is_caught_file_by_file(golden: Path) -> None:
    report = replay_dir(golden, [QuoteReviewed(Catalog()), Greeting])
    assert [r.path.name for r in report.diverged] == ["quote-desk.json"]
    assert [r.path.name for r in report.results if r.ok] == [
        "greeting-ann.json",
        "quote-pen.json",
    ]
    assert report.errors == [] and not report.passed
    bad = report.diverged[0]
    assert isinstance(bad.error, NonDeterminismError)
    assert bad.run_id == "quote-desk" and bad.workflow == "quote"
    assert "timer_started" in bad.error.report() and "reviewed" in bad.error.report()

    with pytest.raises(ReplayFailedError) as info:
        report.raise_for_failures()
    message = str(info.value)
    assert isinstance(info.value, AssertionError) and info.value.report is report
    assert "quote-desk.json" in message and "timer_started" in message
    assert "quote-pen" not in message and "greeting-ann" not in message
    assert message.splitlines()[1] == (f"3 histories in {golden}: 2 ok, 1 diverged, 0 errors")


# -- the details --------------------------------------------------------------------------------


def test_files_that_are_not_histories_are_errors(golden: Path) -> None:
    (golden / "notes.json").write_text('{"todo": "more tests"}')
    (golden / "broken.json").write_text("{not json")
    (golden / "README.md").write_text("ignored: not *.json")
    report = replay_dir(golden, [Quote(Catalog()), Greeting])
    assert sorted(r.path.name for r in report.errors) == ["broken.json", "notes.json"]
    assert report.diverged == [] and len(report.results) == 5
    text = report.summary()
    assert "error     broken.json: history is not valid JSON" in text
    assert "error     notes.json: not a flowkit history" in text
    with pytest.raises(ReplayFailedError, match=r"notes\.json"):
        report.raise_for_failures()


def test_a_history_of_a_workflow_not_given_is_an_error(golden: Path) -> None:
    report = replay_dir(golden, Quote(Catalog()))  # one workflow is fine too
    [missing] = report.errors
    assert missing.path.name == "greeting-ann.json"
    assert isinstance(missing.error, WorkflowNotFoundError)
    assert "no workflow named 'greeting' was given (given: 'quote')" in missing.describe()


def test_an_empty_directory_fails_unless_allowed(tmp_path: Path) -> None:
    report = replay_dir(tmp_path, [Greeting])
    assert report.results == () and report.passed
    with pytest.raises(ReplayFailedError, match="no histories to replay in"):
        report.raise_for_failures()
    report.raise_for_failures(allow_empty=True)
    with pytest.raises(NotADirectoryError):
        replay_dir(tmp_path / "missing", [Greeting])


def test_pattern_and_bad_workflows(golden: Path) -> None:
    (golden / "old").mkdir()
    (golden / "quote-desk.json").rename(golden / "old" / "quote-desk.json")
    flat = replay_dir(golden, [QuoteReviewed(Catalog()), Greeting])
    assert flat.passed and len(flat.results) == 2
    deep = replay_dir(golden, [QuoteReviewed(Catalog()), Greeting], pattern="**/*.json")
    assert [r.path.relative_to(golden).as_posix() for r in deep.diverged] == ["old/quote-desk.json"]
    with pytest.raises(TypeError, match="not a @workflow"):
        replay_dir(golden, [Catalog()])
    with pytest.raises(ValueError, match="two workflows named 'quote'"):
        replay_dir(golden, [Quote, QuoteReviewed])


async def test_async_form_and_loop_guard(golden: Path) -> None:
    report = await replay_dir_async(golden, [Quote(Catalog()), Greeting])
    assert isinstance(report, ReplayReport) and report.passed and len(report.results) == 3
    with pytest.raises(RuntimeError, match="replay_dir_async"):
        replay_dir(golden, [Greeting])


def test_a_run_still_in_flight_replays_up_to_its_last_event(tmp_path: Path) -> None:
    async def in_flight() -> History:
        async with TestEnv([Quote(Catalog())]) as env:
            await env.start("quote", "desk", "quote-live")  # now sleeping for an hour
            return await env.history("quote-live")

    hist = asyncio.run(in_flight())
    assert hist.types[-1] == "timer_started"
    (tmp_path / "quote-live.json").write_text(hist.to_json())
    assert replay_dir(tmp_path, [Quote(Catalog())]).passed
    report = replay_dir(tmp_path, [QuoteReviewed(Catalog())])
    assert [r.path.name for r in report.diverged] == ["quote-live.json"]
