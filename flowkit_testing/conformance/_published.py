"""Checks of ``latest_event`` (stores with it: ``base.LatestEvent``), the read behind
``engine.get_event`` (a run's newest ``event_set`` of a key) and ``engine.update`` (its
reply)."""

from __future__ import annotations

from flowkit.events import Event, EventSet, StepCompleted, UpdateReplied
from flowkit.stores.base import Update

from ._registry import check
from ._support import T0, StoreFactory, expect_eq, make_store, mk, put

LATEST = ["latest_event"]


@check(requires=LATEST)
async def check_latest_event_finds_the_newest_match(factory: StoreFactory) -> None:
    """``latest_event(run_id, type, field, value)`` returns the newest event of ``type``
    whose ``field`` equals ``value`` (its ``seq`` and payload as written), skipping other
    types and values; ``None`` for no match and for an unknown run."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    events: list[Event] = [
        EventSet(pos="1", key="stage", value={"n": 1}, at=T0 + 1),
        EventSet(pos="2", key="other", value="x", at=T0 + 1),
        StepCompleted(pos="3", name="stage", result="not an event_set", at=T0 + 1),
        EventSet(pos="4", key="stage", value={"n": 2, "é": [1.5, None]}, at=T0 + 1),
        UpdateReplied(pos="5", name="change", update_id="u1", value=42, at=T0 + 1),
        EventSet(pos="6", key="other", value="y", at=T0 + 1),
    ]
    res = await s.commit("r", "w1", T0 + 1, Update(events=events))
    found = await s.latest_event("r", "event_set", "key", "stage")  # type: ignore[attr-defined]
    expect_eq(
        (found.seq, found.pos, found.value) if found is not None else None,
        (res.seqs[3], "4", {"n": 2, "é": [1.5, None]}),
        "the newest event_set of key 'stage' (seq, pos, value)",
    )
    found = await s.latest_event("r", "update_replied", "update_id", "u1")  # type: ignore[attr-defined]
    expect_eq(found.value if found is not None else None, 42, "the update_replied of update u1")
    for args in (
        ("r", "event_set", "key", "missing"),
        ("r", "update_replied", "update_id", "u2"),
        ("r", "step_completed", "key", "stage"),
        ("nope", "event_set", "key", "stage"),
    ):
        got = await s.latest_event(*args)  # type: ignore[attr-defined]
        expect_eq(got, None, f"latest_event{args}")
