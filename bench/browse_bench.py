"""The dashboard's reads on 100,000 runs (``flowkit._client.browse``, docs/ui.md), each pushed down
to the store (``BrowsesRuns``, ``ChangeStamp``) against the ``list_runs`` fallback the same
functions use on a store without them (the capability hidden): the same-run baseline, printed
as a ratio. Seeded by ``_seed.seed_runs`` (bulk ``INSERT``: a mix of workflows, statuses and
tags, 50 singleton lanes, one with a deep queue) on a SQLite file and a throwaway PostgreSQL.

Figures, in ms (median of ``REPEAT`` calls after one warm-up; the fallback ``SLOW_REPEAT``):
the runs page (``page_runs(limit=50)`` + ``count_runs()``), a filtered page (workflow +
status), page 20 by keyset (``before`` the 19th page's last run), ``lanes()``, ``lane()`` of
the deepest lane, and ``change_stamp()`` (the fallback: ``list_runs()``'s count and newest
``updated_at``, what ``watch_changes`` compares without it). Run
``python bench/browse_bench.py [--smoke] [--runs N]`` (also part of ``bench/run.py``); smoke:
2,000 runs, SQLite only."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _seed import DEEP_LANE, SINGLETON_WF, seed_runs  # noqa: E402

from flowkit._client import browse as _browse  # noqa: E402
from flowkit._core.run import RunStatus  # noqa: E402
from flowkit.stores import SqlStore  # noqa: E402

REPEAT = 15
SLOW_REPEAT = 3


class _Hidden:
    """The store seen without ``BrowsesRuns`` and ``ChangeStamp``: ``list_runs`` only."""

    def __init__(self, inner: SqlStore) -> None:
        self._inner = inner

    async def list_runs(self, **kw: Any) -> Any:
        return await self._inner.list_runs(**kw)


async def _ms(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    await call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 3)


async def _page20(store: Any) -> tuple[float, str]:
    before = None
    for _ in range(19):
        page = await _browse.page_runs(store, before=before, limit=50)
        before = (page[-1].created_at, page[-1].id)
    assert before is not None
    return before


async def measure(url: str, n: int, smoke: bool) -> dict[str, Any]:
    t = time.perf_counter()
    seed_runs(url, n)
    out: dict[str, Any] = {"runs": n, "seed_s": round(time.perf_counter() - t, 2)}
    store = SqlStore(url)
    try:
        hidden: Any = _Hidden(store)
        before = await _page20(store)
        assert before == await _page20(hidden)
        deep = await _browse.lane(store, SINGLETON_WF, DEEP_LANE)
        out["deepest_lane_waiting"] = deep.waiting

        async def runs_page(s: Any) -> None:
            await _browse.page_runs(s, limit=50)
            await _browse.count_runs(s)

        async def fallback_stamp() -> Any:
            runs = await store.list_runs()
            return (len(runs), max((r.updated_at for r in runs), default=0.0))

        ops: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "runs_page": runs_page,
            "filtered_page": lambda s: _browse.page_runs(
                s, workflow="orders", status=RunStatus.FAILED, limit=50
            ),
            "page_20": lambda s: _browse.page_runs(s, before=before, limit=50),
            "lanes": lambda s: _browse.lanes(s),
            "deepest_lane": lambda s: _browse.lane(s, SINGLETON_WF, DEEP_LANE),
            "change_stamp": lambda s: s.change_stamp() if s is store else fallback_stamp(),
        }
        for name, op in ops.items():
            fast = await _ms(lambda op=op: op(store), 3 if smoke else REPEAT)  # type: ignore[misc]
            slow = await _ms(lambda op=op: op(hidden), 1 if smoke else SLOW_REPEAT)  # type: ignore[misc]
            out[name] = {
                "store_ms": fast,
                "fallback_ms": slow,
                "fallback_over_store": round(slow / fast, 1) if fast > 0 else None,
            }
        return out
    finally:
        store.close()


def _print(results: dict[str, Any]) -> None:
    for db, r in results.items():
        print(
            f"browse ({db}, {r['runs']:,} runs, seeded in {r['seed_s']} s;"
            f" deepest lane: {r['deepest_lane_waiting']} waiting)"
        )
        for name, v in r.items():
            if isinstance(v, dict):
                print(
                    f"  {name:<14} store {v['store_ms']:9.3f} ms   list_runs fallback"
                    f" {v['fallback_ms']:10.3f} ms   {v['fallback_over_store']}x"
                )


async def main(smoke: bool, pg_url: str | None, tmp: Path, n: int | None = None) -> dict[str, Any]:
    n = n or (2_000 if smoke else 100_000)
    results: dict[str, Any] = {"sqlite": await measure(f"sqlite:///{tmp}/browse.db", n, smoke)}
    if pg_url is not None and not smoke:
        from tests.pg import fresh_database

        results["postgres"] = await measure(
            fresh_database(pg_url, prefix="flowkit_bench"), n, smoke
        )
    _print(results)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    import store_bench

    with tempfile.TemporaryDirectory() as tmp, store_bench.postgres_server() as pg:
        print(json.dumps(asyncio.run(main(args.smoke, pg, Path(tmp), args.runs)), indent=2))
