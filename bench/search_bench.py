"""Search over many runs (docs/search-and-retention.md): ``list_runs(search=...)`` on 100,000 runs,
each with two search attributes (``customer``: one of 1,000; ``amount``: 0..4,999), filled by bulk
``INSERT`` (``tests/search_kit.py``) on a SQLite file and a throwaway PostgreSQL.

Figures, in ms (median of ``REPEAT`` calls, after one warm-up): the first page (50 runs)
without a filter, the first page with ``customer == c-7`` (100 matches), with
``amount >= 4995`` (100 matches), and the whole filtered list of ``customer == c-7``; and a
page 1,000 pages deep with ``after`` (keyset: as fast as the first). The plan test
(``tests/test_search_plan.py``) shows the index each one uses. Run
``python bench/search_bench.py [--smoke]`` (also part of ``bench/run.py``); smoke: 5,000
runs, SQLite only."""

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

from flowkit.stores import SqlStore  # noqa: E402
from flowkit.stores.base import parse_filter  # noqa: E402
from tests.search_kit import fill  # noqa: E402

REPEAT = 15


async def _ms(call: Callable[[], Awaitable[Any]]) -> float:
    await call()
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        await call()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 3)


async def measure(url: str, n: int) -> dict[str, Any]:
    store = SqlStore(url)
    try:
        t = time.perf_counter()
        fill(store, n)
        out: dict[str, Any] = {"runs": n, "fill_s": round(time.perf_counter() - t, 2)}
        cust = parse_filter({"customer": "c-7"})
        amount = parse_filter({"amount": (">=", 4995)})
        deep = await store.list_runs(limit=1, after=None)
        deep_after = (deep[0].created_at + 50_000 * (n // 100_000 or 1) - 1, "")
        out["page_unfiltered_ms"] = await _ms(lambda: store.list_runs(limit=50))
        out["page_customer_ms"] = await _ms(lambda: store.list_runs(search=cust, limit=50))
        out["page_amount_range_ms"] = await _ms(lambda: store.list_runs(search=amount, limit=50))
        out["all_customer_ms"] = await _ms(lambda: store.list_runs(search=cust))
        out["page_deep_after_ms"] = await _ms(lambda: store.list_runs(limit=50, after=deep_after))
        return out
    finally:
        store.close()


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    n = 5_000 if smoke else 100_000
    results: dict[str, Any] = {"sqlite": await measure(f"sqlite:///{tmp}/search.db", n)}
    if pg_url is not None and not smoke:
        from tests.pg import fresh_database

        results["postgres"] = await measure(fresh_database(pg_url, prefix="flowkit_bench"), n)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import store_bench

    with tempfile.TemporaryDirectory() as tmp, store_bench.postgres_server() as pg:
        asyncio.run(main(args.smoke, pg, Path(tmp)))
