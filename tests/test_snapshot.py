"""Golden histories with syrupy (``flowkit_testing._snapshot``): a small singleton workflow with
steps, a retried step, a sleep, a signal and a gate, snapshotted with
``HistorySnapshotExtension`` (files under ``tests/__snapshots__/test_snapshot/``; regenerate
with ``pytest tests/test_snapshot.py --snapshot-update`` after a deliberate change); the
normalization of volatile values; and a changed history failing the comparison."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from syrupy.assertion import SnapshotAssertion
from syrupy.filters import props

from flowkit import History, RetryPolicy, Singleton, WorkflowCtx, workflow
from flowkit.events import (
    ErrorInfo,
    RunStarted,
    SingletonGated,
    StepCompleted,
    StepFailed,
    TimerStarted,
)
from flowkit.stores import SqlStore
from flowkit_testing import TestEnv
from flowkit_testing._snapshot import (
    HistorySnapshotExtension,
    normalize_history,
    render_histories,
)

SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_snapshot"


class GreetIn(BaseModel):
    desk: str
    name: str


class Directory:
    """Outside the engine: a random id on every call (normalized in snapshots) and one
    transient failure per name (a retried step)."""

    def __init__(self) -> None:
        self.failed: set[str] = set()

    def lookup(self, name: str) -> dict[str, Any]:
        if name not in self.failed:
            self.failed.add(name)
            raise ConnectionError(f"directory busy for {name} at {object()!r}")
        return {"name": name.title(), "ref": str(uuid.uuid4())}


@workflow(name="greeter", singleton=Singleton(key=lambda i: f"desk:{i.desk}"))
class Greeter:
    def __init__(self, directory: Directory, pause: float = 60.0, audit: bool = False) -> None:
        self.directory = directory
        self.pause = pause
        self.audit_texts = audit

    def greet(self, profile: dict[str, Any], decision: Any) -> str:
        return f"hello {profile['name']} ({decision['mood']})"

    def audit(self, text: str) -> int:
        return len(text)

    async def run(self, ctx: WorkflowCtx, input: GreetIn) -> str:
        profile = await ctx.step(
            self.directory.lookup, input.name, retry=RetryPolicy(initial_interval=2.5)
        )
        await ctx.sleep(self.pause)
        decision = await ctx.wait_for_signal("approve", timeout=86400)
        text: str = await ctx.step(self.greet, profile, decision)
        if self.audit_texts:
            await ctx.step(self.audit, text)
        return text


async def lane(
    *, seed: int = 7, start: float | datetime | None = None, store: Any = None, **kw: Any
) -> dict[str, History]:
    """Two runs of one desk: ``ada`` holds the slot; ``bob`` is gated until ada settles."""
    opts: dict[str, Any] = {"seed": seed, "store": store}
    if start is not None:
        opts["start"] = start
    async with TestEnv([Greeter(Directory(), **kw)], **opts) as env:
        await env.start("greeter", {"desk": "front", "name": "ada"}, "greet-ada")
        await env.advance(1)
        await env.start("greeter", {"desk": "front", "name": "bob"}, "greet-bob")
        await env.advance(100)  # ada: lookup retried, slept, now waits for approval
        await env.signal("greet-ada", "approve", {"mood": "cheerful"})
        await env.advance(100)  # bob admitted on ada's release: the same steps
        await env.signal("greet-bob", "approve", {"mood": "calm"})
        assert await env.result("greet-ada") == "hello Ada (cheerful)"
        assert await env.result("greet-bob") == "hello Bob (calm)"
        return {rid: await env.history(rid) for rid in ("greet-ada", "greet-bob")}


@pytest.fixture
def history_snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """What the plugin's fixture of the same name gives (overridden here so this module
    does not depend on the plugin)."""
    return snapshot.use_extension(HistorySnapshotExtension)


# -- golden histories ------------------------------------------------------------------------


async def test_golden_history_of_the_holder(history_snapshot: SnapshotAssertion) -> None:
    histories = await lane()
    assert history_snapshot == histories["greet-ada"]


async def test_golden_history_of_a_gated_run(history_snapshot: SnapshotAssertion) -> None:
    histories = await lane()
    assert histories["greet-bob"].types[:3] == [
        "run_started",
        "singleton_gated",
        "singleton_admitted",
    ]
    assert history_snapshot == histories["greet-bob"]


async def test_golden_histories_of_the_lane(history_snapshot: SnapshotAssertion) -> None:
    histories = await lane()
    # several runs share one time origin: the snapshot shows bob admitted as ada releases
    assert history_snapshot == histories


# -- normalization ---------------------------------------------------------------------------


async def test_volatile_values_are_normalized_away() -> None:
    a = await lane(seed=7)
    b = await lane(seed=12345, start=datetime(2031, 6, 1, 12, 30, tzinfo=UTC))
    for rid in a:
        assert a[rid].to_json() != b[rid].to_json()  # other times, other ids, other jitter
        assert normalize_history(a[rid]) == normalize_history(b[rid])
    assert render_histories(a) == render_histories(b)


async def test_golden_histories_do_not_depend_on_the_store(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'golden.db'}")
    try:
        on_sqlite = await lane(store=store)
    finally:
        store.close()
    assert render_histories(on_sqlite) == _golden("test_golden_histories_of_the_lane")


def test_normalize_history_rules() -> None:
    t = 1_767_225_600.0
    ref = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    run_id = "6fa459ea-ee8a-3ca4-894e-db77e160355e"
    h = History(
        run_id,
        [
            RunStarted(seq=1, at=t, workflow="w", version="1", input={"b": 1, "a": ref}),
            SingletonGated(seq=2, at=t + 0.5, key="k", retry_at=t + 0.5 + 1.137),
            SingletonGated(seq=3, at=t + 2, key="k", retry_at=t + 7),
            StepFailed(
                seq=4,
                at=t + 2.0004,
                pos="0",
                name="f",
                error=ErrorInfo(type="E", message=f"no {ref.upper()} at 0x7f3a12bc4d50"),
                retry_at=t + 4.5,
            ),
            StepCompleted(
                seq=5, at=t + 4.5, pos="0", name="f", result=[run_id, ref, str(uuid.UUID(int=5))]
            ),
            TimerStarted(seq=6, at=t + 61.25, pos="1", fire_at=t + 86400 * 30),
        ],
    )
    got = normalize_history(h)
    assert [list(e)[:3] for e in got] == [["seq", "type", "at"]] * 6
    assert [e["at"] for e in got] == ["t+0", "t+0.5", "t+2", "t+2", "t+4.5", "t+61.25"]
    assert got[0]["input"] == {"a": "<uuid-1>", "b": 1}
    assert list(got[0]["input"]) == ["a", "b"]
    assert got[1]["retry_at"] == "~at+1s"  # inside the jitter window
    assert got[2]["retry_at"] == "at+5"  # outside: exact
    assert got[3]["error"]["message"] == "no <uuid-1> at 0x<addr>"
    assert got[3]["retry_at"] == "t+4.5"
    assert got[4]["result"] == [run_id, "<uuid-1>", "<uuid-2>"]  # the run id is kept
    assert got[5]["fire_at"] == "t+2592000"
    assert normalize_history(h, origin=t - 10)[0]["at"] == "t+10"
    assert normalize_history(h, origin=t + 1)[0]["at"] == "t-1"
    assert normalize_history(list(h))[4]["result"][0] == "<uuid-2>"  # no History: no run id


def test_the_extension_renders_one_event_per_line() -> None:
    t = 1_767_225_600.0
    h = History("r", [RunStarted(seq=1, at=t, workflow="w", version="1", input="é")])
    text = HistorySnapshotExtension().serialize(h)
    assert text == (
        "{\n"
        '  "run_id": "r",\n'
        '  "events": [\n'
        '    {"seq": 1, "type": "run_started", "at": "t+0", "input": "é", "tags": [], '
        '"version": "1", "workflow": "w"}\n'
        "  ]\n"
        "}\n"
    )
    # other data goes through syrupy's JSON serializer unchanged
    assert HistorySnapshotExtension().serialize({"b": 1, "a": [1]}) == (
        '{\n  "a": [\n    1\n  ],\n  "b": 1\n}\n'
    )
    # syrupy's property filters apply to the normalized events
    step = StepCompleted(seq=2, at=t + 1, pos="0", name="f", result=1, args_digest="abc")
    h2 = History("r", [*h, step])
    text = HistorySnapshotExtension().serialize(h2, exclude=props("args_digest", "version"))
    assert '"args_digest"' not in text and '"version"' not in text
    assert '    {"seq": 2, "type": "step_completed", "at": "t+1", "attempt": 1,' in text
    with pytest.raises(TypeError):
        render_histories([])  # type: ignore[arg-type]


# -- a changed history fails the comparison --------------------------------------------------


def _golden(test_name: str) -> str:
    path = SNAPSHOTS / f"{test_name}.json"
    assert path.exists(), f"missing golden file {path}: run pytest with --snapshot-update"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "diff_hint"),
    [
        (lambda: lane(pause=120.0), '"fire_at": "t+'),
        (lambda: lane(audit=True), '"name": "Greeter.audit"'),
    ],
    ids=["longer-sleep", "extra-step"],
)
async def test_a_changed_history_fails_the_comparison(
    change: Callable[[], Any], diff_hint: str
) -> None:
    ext = HistorySnapshotExtension()
    golden = _golden("test_golden_history_of_a_gated_run")
    assert ext.serialize((await lane())["greet-bob"]) == golden  # the unchanged workflow matches
    changed = ext.serialize((await change())["greet-bob"])
    assert changed != golden
    diff = ext.diff_snapshots(changed, golden)
    assert diff_hint in diff, diff
