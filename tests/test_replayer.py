"""``replay_dir``: the CI regression test of workflow code against golden histories.

The first part is the pattern of docs/debugging.md ("Golden histories in CI"), made real on the
committed golden histories of ``tests/histories/`` (recorded from ``histories/workflows.py``):
the current code replays all of them, and a breaking change is caught file by file. The
details work on a copy of them in ``tmp_path``."""

from __future__ import annotations

import shutil
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

try:
    from histories.workflows import Catalog, Greeting, Quote, workflows
except ImportError:  # tests/ imported as a package
    from tests.histories.workflows import Catalog, Greeting, Quote, workflows

HISTORIES = Path(__file__).parent / "histories"


@workflow(name="quote")
class QuoteReviewed:
    """A later change of ``Quote``: big quotes now wait for a reviewer's signal instead of an
    hour. Runs of small quotes are unaffected; a big quote recorded by the old code would not
    replay."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, ctx: WorkflowCtx, sku: str) -> int:
        price = await ctx.step(self.catalog.price, sku)
        if price > 1000:
            await ctx.wait_for_signal("reviewed")
        return price


def reviewed() -> list[object]:
    """The golden histories' workflows, with ``QuoteReviewed`` in place of ``Quote``."""
    return [QuoteReviewed(Catalog()) if isinstance(w, Quote) else w for w in workflows()]


@pytest.fixture
def golden(tmp_path: Path) -> Path:
    """A copy of the quote and greeting histories, for the tests that change the directory."""
    directory = tmp_path / "histories"
    directory.mkdir()
    for name in ("quote-pen", "quote-desk", "greeting-ann"):
        shutil.copy(HISTORIES / f"{name}.json", directory)
    return directory


# -- the documented pattern --------------------------------------------------------------------


def test_golden_histories_still_replay() -> None:
    replay_dir(HISTORIES, workflows()).raise_for_failures()


def test_a_breaking_change_is_caught_file_by_file() -> None:
    report = replay_dir(HISTORIES, reviewed())
    every = sorted(p.name for p in HISTORIES.glob("*.json"))
    # the big quotes diverge: the one that slept its hour, and the one still in it
    assert [r.path.name for r in report.diverged] == ["quote-desk.json", "quote-live.json"]
    assert [r.path.name for r in report.results if r.ok] == [
        name for name in every if name not in ("quote-desk.json", "quote-live.json")
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
    assert message.splitlines()[1] == (
        f"{len(every)} histories in {HISTORIES}: {len(every) - 2} ok, 2 diverged, 0 errors"
    )


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


def test_a_run_still_in_flight_replays_up_to_its_last_event() -> None:
    live = "quote-live.json"  # recorded while the big quote sleeps its hour
    assert History.from_json((HISTORIES / live).read_bytes()).types[-1] == "timer_started"
    assert replay_dir(HISTORIES, Quote(Catalog()), pattern=live).passed
    report = replay_dir(HISTORIES, QuoteReviewed(Catalog()), pattern=live)
    assert [r.path.name for r in report.diverged] == [live]
    assert "timer_started" in report.summary() and "reviewed" in report.summary()
