"""Singleton benchmarks: admission cost under backlog, and handover latency.

Figures are ratios against a baseline measured in the same run, never absolute claims.
Run: ``python bench/run.py`` (``--smoke`` for a tiny, CI-sized pass)."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flowkit import ADMITTED_TAG, Engine, Run, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.stores import MemoryStore

WF = "bench-sync"


def _run(run_id: str, key: str, created_at: float, admitted: bool = False) -> Run:
    tags = (f"singleton:{key}",) + ((ADMITTED_TAG,) if admitted else ())
    return Run(
        id=run_id,
        workflow=WF,
        workflow_version="1",
        status=RunStatus.RUNNING if admitted else RunStatus.SUSPENDED,
        input={},
        tags=tags,
        created_at=created_at,
        updated_at=created_at,
        wake_at=None if admitted else created_at + 1,
        singleton_key=key,
    )


BulkLoad = Callable[[Any, list[Run]], Awaitable[None]]


@dataclass(frozen=True)
class AdmissionStore:
    """One kind of store for the admission bench: ``make`` returns a fresh, empty store;
    ``load`` inserts the backlog in bulk (``None``: ``create_run`` one by one)."""

    name: str
    make: Callable[[], Any]
    load: BulkLoad | None = None
    claims_scale: int = 1  # more timed claims where one is cheap (memory), for steadier means


async def _create_each(store: Any, runs: list[Run]) -> None:
    for run in runs:
        await store.create_run(run, [])


async def _store_with_backlog(
    store: Any, gated: int, keys: int = 100, load: BulkLoad | None = None
) -> None:
    """``keys`` holders, and ``gated`` waiters spread over those keys."""
    t = 1_700_000_000.0
    runs = [_run(f"h{k}", f"busy{k}", t, admitted=True) for k in range(keys)]
    runs += [_run(f"w{i:06d}", f"busy{i % keys}", t + 1 + i * 1e-6) for i in range(gated)]
    await (load or _create_each)(store, runs)


ROUND_RATIOS: dict[int, float] = {}


async def admission_under_backlog(
    store_factory: Any,
    backlogs: list[int],
    fresh: int,
    load: BulkLoad | None = None,
    rounds: int = 10,
) -> dict[int, float]:
    """Mean seconds per ``try_admit_singleton`` of a fresh key, per backlog size.

    One store per backlog size is filled first; the timed claims then alternate between them
    in ``rounds`` chunks (rotating the order), so drift of the machine (page cache, WAL
    checkpoints, a noisy neighbour) spreads over every size instead of biasing one."""
    stores: dict[int, Any] = {}
    for n in backlogs:
        store = store_factory()
        await _store_with_backlog(store, n, load=load)
        for i in range(fresh):
            await store.create_run(_run(f"fresh{i}", f"fresh{i}", 1_800_000_000.0), [])
        stores[n] = store
    spent = dict.fromkeys(backlogs, 0.0)
    per_round: dict[int, list[float]] = {n: [] for n in backlogs}
    chunk = math.ceil(fresh / rounds)
    for r, lo in enumerate(range(0, fresh, chunk)):
        order = backlogs[r % len(backlogs) :] + backlogs[: r % len(backlogs)]
        for n in order:
            store = stores[n]
            t0 = time.perf_counter()
            for i in range(lo, min(lo + chunk, fresh)):
                ok = await store.try_admit_singleton(
                    f"fresh{i}", f"singleton:fresh{i}", WF, 1, None
                )
                assert ok
            took = time.perf_counter() - t0
            spent[n] += took
            per_round[n].append(took)
    base = per_round[backlogs[0]]
    ROUND_RATIOS.clear()  # the median over rounds of (this size / empty) of the same round
    ROUND_RATIOS.update(
        {
            n: statistics.median(a / b for a, b in zip(per_round[n], base, strict=True))
            for n in backlogs
        }
    )
    for store in stores.values():
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return {n: spent[n] / fresh for n in backlogs}


@workflow(name=WF, singleton=Singleton(key=lambda inp: f"k{inp['k']}"))
class BenchSync:
    def __init__(self) -> None:
        self.first_step: dict[str, float] = {}

    async def mark(self, run_id: str) -> None:
        self.first_step[run_id] = time.perf_counter()

    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> None:
        await ctx.step(self.mark, ctx.run_id)
        await ctx.step(asyncio.sleep, 0.005, name="work")


async def handover(notify: bool, runs: int) -> list[float]:
    """Seconds from a holder's release to the next same-key run's first step."""
    wf = BenchSync()
    store = MemoryStore()
    engine = Engine(store, [wf], notify_on_release=notify, poll_interval=0.05)
    async with engine:
        ids = [f"r{i:03d}" for i in range(runs)]
        for rid in ids:
            await engine.start(WF, {"k": 0}, rid)
        for rid in ids:
            await engine.result(rid, timeout=120)
        # release instants: the store clock is wall time here; convert via event `at` deltas
        lat = []
        for prev, nxt in itertools.pairwise(ids):
            hist = await engine.history(prev)
            released_at = next(e.at for e in hist if e.type == "singleton_released")
            nxt_hist = await engine.history(nxt)
            first_step = next(e.at for e in nxt_hist if e.type == "step_completed")
            lat.append(first_step - released_at)
        return lat


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, math.ceil(len(xs) * 0.95) - 1)]


async def main(smoke: bool, stores: list[AdmissionStore] | None = None) -> dict[str, Any]:
    """``stores``: the stores to measure admission on (default: ``MemoryStore`` only;
    ``bench/run.py`` adds SQLite and PostgreSQL from ``store_bench.admission_stores``)."""
    backlogs = [0, 100] if smoke else [0, 1_000, 10_000]
    stores = stores or [AdmissionStore("memory", MemoryStore, claims_scale=10)]
    adm_all: dict[str, dict[int, float]] = {}
    medians: dict[str, dict[int, float]] = {}
    for st in stores:
        fresh = (50 if smoke else 500) * st.claims_scale
        adm = await admission_under_backlog(st.make, backlogs, fresh=fresh, load=st.load)
        adm_all[st.name] = adm
        medians[st.name] = dict(ROUND_RATIOS)
        base = adm[backlogs[0]]
        print(f"admission of a fresh key ({st.name}), backlog gated on other keys:")
        for n, t in adm.items():
            print(
                f"  {n:>6} gated: {t * 1e6:8.1f} us/claim   ratio to empty: {t / base:5.2f}x"
                f"   (median of the per-round ratios: {ROUND_RATIOS[n]:5.2f}x)"
            )
    n_runs = 5 if smoke else 20
    notify = await handover(True, n_runs)
    timer = await handover(False, 3 if smoke else 8)
    print("handover latency, release -> next waiter's first step recorded:")
    print(
        f"  notify-on-release: mean {statistics.mean(notify) * 1e3:7.2f} ms"
        f"  p95 {_p95(notify) * 1e3:7.2f} ms"
    )
    print(
        f"  timer fallback   : mean {statistics.mean(timer) * 1e3:7.2f} ms"
        f"  p95 {_p95(timer) * 1e3:7.2f} ms"
    )
    print(f"  timer / notify mean ratio: {statistics.mean(timer) / statistics.mean(notify):.0f}x")
    return {
        "admission_us": {
            name: {str(k): v * 1e6 for k, v in adm.items()} for name, adm in adm_all.items()
        },
        "admission_ratio_max": {
            name: max(adm.values()) / adm[backlogs[0]] for name, adm in adm_all.items()
        },
        "admission_round_median_ratio": {
            name: {str(k): v for k, v in m.items()} for name, m in medians.items()
        },
        "handover_notify_ms": [x * 1e3 for x in notify],
        "handover_timer_ms": [x * 1e3 for x in timer],
    }


if __name__ == "__main__":
    asyncio.run(main(False))
