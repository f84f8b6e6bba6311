"""A page of a run's history (``flowkit._client.browse.page_events``, the dashboard's run page,
docs/ui.md "Pages"): on every bundled store (memory, a SQLite file, PostgreSQL, a
``CodecStore``) the store's ``events_page`` answers what cutting the whole history answers,
newest page, ``before`` and ``after`` pages and a type filter included; an unknown run is
``RunNotFoundError``."""

from __future__ import annotations

from typing import Any

import pytest

from flowkit import Engine, WorkflowCtx, workflow
from flowkit._client import browse as _browse
from flowkit.errors import RunNotFoundError
from flowkit.stores._capabilities import pages_events
from flowkit.stores.codec import AESGCMCodec, CodecStore

KEY = AESGCMCodec({"k1": b"k" * 32})
STEPS = 12


@workflow(name="pages")
class Pages:
    """``STEPS`` steps, a published value, then done."""

    async def one(self, i: int) -> dict[str, Any]:
        return {"i": i, "secret": "s" * i}

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        for i in range(n):
            await ctx.step(self.one, i)
            if i == 3:
                await ctx.set_event("progress", {"done": i})
        return n


class LoadsOnly:
    """A store seen through ``load_events`` only (``page_events`` falls back)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def load_events(self, run_id: str) -> Any:
        return await self._inner.load_events(run_id)


async def _check(store: Any) -> None:
    assert pages_events(store)
    async with Engine(store, [Pages()], poll_interval=0.02) as engine:
        await engine.start("pages", STEPS, "r")
        assert await engine.result("r", timeout=30) == STEPS
    everything = await store.load_events("r")
    total = len(everything)
    assert total > STEPS
    slow = LoadsOnly(store)
    cases: list[dict[str, Any]] = [
        {"limit": 5},
        {"limit": 500},
        {"before": 8, "limit": 3},
        {"before": 2, "limit": 3},
        {"before": 6, "limit": 50},
        {"after": 0, "limit": 4},
        {"after": total - 2, "limit": 4},
        {"after": total, "limit": 4},
        {"limit": 0},
        {"types": ["event_set"], "limit": 5},
        {"types": ["compensation_completed", "compensation_failed"], "limit": 1},
        {"types": ["step_completed"], "after": 5, "limit": 2},
    ]
    for kw in cases:
        fast = await _browse.page_events(store, "r", **kw)
        cut = await _browse.page_events(slow, "r", **kw)  # type: ignore[arg-type]
        assert fast == cut, kw
    short = await _browse.page_events(store, "r", before=6, limit=50)
    assert [e.seq for e in short.events] == [1, 2, 3, 4, 5]  # (fewer than the limit)
    newest = await _browse.page_events(store, "r", limit=5)
    assert [e.seq for e in newest.events] == [e.seq for e in everything[-5:]]
    assert (newest.count, newest.first_seq, newest.last_seq) == (total, 1, total)
    published = await _browse.page_events(store, "r", types=["event_set"])
    assert [e.type for e in published.events] == ["event_set"] and published.count == 1
    assert getattr(published.events[0], "value", None) == {"done": 3}  # (decoded)
    none = await _browse.page_events(store, "r", types=["compensation_failed"])
    assert (none.events, none.count, none.first_seq, none.last_seq) == ([], 0, None, None)
    with pytest.raises(RunNotFoundError):
        await _browse.page_events(store, "nope")


async def test_a_page_of_a_history_is_what_cutting_all_of_it_gives(store: Any) -> None:
    await _check(store)


async def test_a_codec_store_forwards_it_decoded(store: Any) -> None:
    await _check(CodecStore(store, KEY))
