"""The committed golden histories (``tests/histories/*.json``) replay against the current code,
and together they hold every event type of ``flowkit.events.Event``.

The histories were recorded from ``tests/histories/workflows.py`` and are kept as they are: a
change to the replay core or to those workflows must still replay them, as it must replay the
runs in flight when it is deployed. ``FLOWKIT_RECORD_HISTORIES=1 pytest
tests/test_golden_histories.py`` records them all again (on purpose only: for a new scenario,
say); without it nothing is written. Recording is byte-stable, so the diff shows only what
changed: a history the current code records differently is normally restored from git, not
committed, since it stands for runs recorded by the older code."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from flowkit import History, replay_dir
from flowkit.events import EVENT_TYPES

try:
    from histories import workflows as golden
except ImportError:  # tests/ imported as a package
    from tests.histories import workflows as golden

HISTORIES = Path(__file__).parent / "histories"


def _record_all() -> dict[str, str]:
    return {rid: h.to_json() for rid, h in asyncio.run(golden.record()).items()}


@pytest.fixture(scope="module", autouse=True)
def recorded_on_purpose() -> None:
    """With ``FLOWKIT_RECORD_HISTORIES=1``: record the histories again, replacing the files."""
    if os.environ.get("FLOWKIT_RECORD_HISTORIES") != "1":
        return
    for old in HISTORIES.glob("*.json"):
        old.unlink()
    for run_id, raw in _record_all().items():
        (HISTORIES / f"{run_id}.json").write_text(raw)


def _committed() -> dict[str, History]:
    return {p.stem: History.from_json(p.read_bytes()) for p in sorted(HISTORIES.glob("*.json"))}


def test_every_golden_history_replays() -> None:
    report = replay_dir(HISTORIES, golden.workflows())
    report.raise_for_failures()
    assert len(report.results) == len(_committed()) >= 10


def test_the_golden_histories_hold_every_event_type() -> None:
    """A new event type fails here until a scenario of ``histories/workflows.py`` records it
    (and the histories are recorded again)."""
    covered = {t for h in _committed().values() for t in h.types}
    assert covered == set(EVENT_TYPES)


def test_the_committed_files_are_the_runs_the_scenarios_record() -> None:
    """Recording is deterministic (a fixed seed, virtual time: the same bytes twice), and it
    records a file for each committed one and no other (a scenario removed or renamed leaves
    no stale history behind, and a new one needs its file)."""
    first, second = _record_all(), _record_all()
    assert first == second
    assert sorted(first) == sorted(_committed())


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
def test_a_golden_history_is_one_run_of_its_file_name(path: Path) -> None:
    history = History.from_json(path.read_bytes())
    assert history.run_id == path.stem
    assert history.types[0] == "run_started"
