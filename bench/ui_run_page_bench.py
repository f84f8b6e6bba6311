"""The size and time of a run's page in the dashboard (``flowkit ui``, docs/ui.md "Pages") for
a run with a long history and for a parent with many children, on a SQLite file: a 3,000-step
run and a parent of 2,000 children, run by a real engine; the page requested in process
(httpx's ASGI transport, no socket: the dashboard's own cost), the median of ``REPEAT``.
Run ``python bench/ui_run_page_bench.py [--smoke]`` (smoke: 300 steps, 200 children)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from flowkit import Engine, WorkflowCtx, workflow  # noqa: E402
from flowkit.cli.ui import create_app  # noqa: E402
from flowkit.stores import SqlStore  # noqa: E402

REPEAT = 5


@workflow(name="long")
class Long:
    """``n`` steps, each with a small result."""

    async def one(self, i: int) -> dict[str, Any]:
        return {"i": i, "text": "some value " * 5}

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        for i in range(n):
            await ctx.step(self.one, i)
        return n


@workflow(name="kid")
class Kid:
    async def run(self, ctx: WorkflowCtx, i: int) -> int:
        return i


@workflow(name="fan")
class Fan:
    """``n`` children at once."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        await ctx.gather(*[ctx.child("kid", i) for i in range(n)])
        return n


async def measure(path: Path, steps: int, kids: int) -> dict[str, Any]:
    store = SqlStore(f"sqlite:///{path}")
    try:
        async with Engine(store, [Long(), Kid(), Fan()], poll_interval=0.05) as engine:
            await engine.start("long", steps, "long")
            await engine.start("fan", kids, "fan")
            for rid in ("long", "fan"):
                await engine.result(rid, timeout=600)
        app = create_app(store, token="t")
        out: dict[str, Any] = {"steps": steps, "children": kids}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            await c.get("/runs?token=t")
            for rid in ("long", "fan"):
                await c.get(f"/runs/{rid}")  # (warm: templates compiled)
                times = []
                for _ in range(REPEAT):
                    t = time.perf_counter()
                    r = await c.get(f"/runs/{rid}")
                    times.append(time.perf_counter() - t)
                    assert r.status_code == 200, r.status_code
                out[rid] = {
                    "bytes": len(r.content),
                    "ms": round(statistics.median(times) * 1000, 1),
                    "events": len(await store.load_events(rid)),
                }
        return out
    finally:
        store.close()


def main(smoke: bool) -> dict[str, Any]:
    steps, kids = (300, 200) if smoke else (3_000, 2_000)
    with tempfile.TemporaryDirectory() as tmp:
        got = asyncio.run(measure(Path(tmp) / "run_page.db", steps, kids))
    for rid in ("long", "fan"):
        g = got[rid]
        print(f"{rid}: {g['events']} events, {g['bytes'] / 1e6:.3f} MB, {g['ms']} ms")
    return got


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true")
    main(p.parse_args().smoke)
