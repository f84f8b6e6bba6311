"""sync_inventory: a singleton workflow, one inventory sync per store at a time.

``SyncInventory`` (the example of docs/writing-workflows.md) is a singleton keyed by ``store:<id>``
with ``limit=1`` and ``max_queue_depth=2``: per store, one run holds the slot and at most two more
wait. The script starts four runs for store A (the fourth is rejected with
``SingletonQueueFullError``) and one for store B, which runs right away on its own slot while
A's queue waits. Once A's backlog drains, the rejected request is accepted.

It uses the real ``Engine`` on a ``MemoryStore`` with the system clock; each step sleeps a
little to stand for I/O, so the whole script takes about 1.5 s. At the end it checks its own
invariants: runs of one store never overlapped, and A's runs were admitted in start order.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass, field

from pydantic import BaseModel

from flowkit import Engine, Singleton, SingletonQueueFullError, WorkflowCtx, workflow
from flowkit.stores import MemoryStore

STEP_SECONDS = 0.15


class SyncInput(BaseModel):
    store_id: str
    request_id: str


class Stock(BaseModel):
    store_id: str
    request_id: str
    counts: dict[str, int]


@dataclass
class InventoryService:
    """A fake inventory backend that records when each sync touched it (for the checks)."""

    started: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    _pulling: defaultdict[str, asyncio.Event] = field(
        default_factory=lambda: defaultdict(asyncio.Event)
    )

    async def wait_until_pulling(self, request_id: str) -> None:
        await self._pulling[request_id].wait()

    async def pull(self, input: SyncInput) -> Stock:
        self.started[input.request_id] = time.monotonic()
        self._pulling[input.request_id].set()
        await asyncio.sleep(STEP_SECONDS)  # stands for a call to the store's POS system
        return Stock(
            store_id=input.store_id,
            request_id=input.request_id,
            counts={"apples": 12, "pears": 7},
        )

    async def reconcile(self, stock: Stock) -> int:
        await asyncio.sleep(STEP_SECONDS)  # stands for writing the corrections
        self.finished[stock.request_id] = time.monotonic()
        return sum(stock.counts.values())


@workflow(
    name="sync-inventory",
    version="1",
    singleton=Singleton(key=lambda inp: f"store:{inp.store_id}", limit=1, max_queue_depth=2),
)
class SyncInventory:
    def __init__(self, inventory: InventoryService) -> None:
        self.inventory = inventory

    async def run(self, ctx: WorkflowCtx, input: SyncInput) -> int:
        stock = await ctx.step(self.inventory.pull, input)
        return await ctx.step(self.inventory.reconcile, stock)


async def start_sync(engine: Engine, store_id: str, run_id: str) -> bool:
    """Start one sync; on a full queue, report it and shed the request."""
    try:
        await engine.start("sync-inventory", {"store_id": store_id, "request_id": run_id}, run_id)
    except SingletonQueueFullError as err:
        print(
            f"rejected {run_id}: queue full for key {err.key!r} "
            f"(workflow {err.workflow!r}, max_queue_depth={err.max_queue_depth})"
        )
        return False
    print(f"started  {run_id}")
    return True


async def admitted_at(engine: Engine, run_id: str) -> float:
    history = await engine.history(run_id)
    return next(e.at for e in history if e.type == "singleton_admitted")


async def print_lanes(engine: Engine) -> None:
    for store in ("A", "B"):
        lane = []
        for run in await engine.list_runs(tag=f"singleton:store:{store}"):
            role = "holds the slot" if run.admitted else "waiting"
            lane.append(f"{run.id} {run.status} ({role})")
        print(f"  store:{store}: " + ", ".join(lane))


async def main() -> None:
    inventory = InventoryService()
    engine = Engine(MemoryStore(), [SyncInventory(inventory)])
    async with engine:
        accepted = [rid for rid in ("A-1", "A-2", "A-3") if await start_sync(engine, "A", rid)]
        if await start_sync(engine, "A", "A-4"):  # limit 1 + max_queue_depth 2 = 3: rejected
            accepted.append("A-4")
        if await start_sync(engine, "B", "B-1"):
            accepted.append("B-1")

        # B has its own key and slot: it is admitted at once, while queue.
        await inventory.wait_until_pulling("B-1")
        print("lanes right after the starts:")
        await print_lanes(engine)

        # Back-pressure is temporary: once A's backlog drains, the shed request fits again.
        await engine.result("A-2", timeout=10)
        if await start_sync(engine, "A", "A-4"):
            accepted.append("A-4")

        results = {rid: await engine.result(rid, timeout=10) for rid in accepted}
        admissions = {rid: await admitted_at(engine, rid) for rid in accepted}
        a2_history = await engine.history("A-2")

    first = min(admissions.values())
    print("admission order per key:")
    for store in ("A", "B"):
        runs = sorted((r for r in accepted if r.startswith(store)), key=admissions.__getitem__)
        order = ", ".join(f"{r} (+{(admissions[r] - first) * 1000:.0f} ms)" for r in runs)
        print(f"  store:{store}: {order}")
    print("results:", results)
    print("A-2 history:", " -> ".join(a2_history.types))

    # The invariants this sample exists to show.
    for store in ("A", "B"):
        spans = sorted(
            (inventory.started[rid], inventory.finished[rid])
            for rid in accepted
            if rid.startswith(store)
        )
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start, f"two syncs of store {store} overlapped"
    a_runs = sorted((r for r in accepted if r.startswith("A")), key=admissions.__getitem__)
    assert a_runs == ["A-1", "A-2", "A-3", "A-4"], a_runs
    assert inventory.started["B-1"] < inventory.finished["A-1"], "B waited for store A"
    print("ok: no two syncs of one store overlapped; A ran in FIFO order; B ran alongside A")


if __name__ == "__main__":
    asyncio.run(main())
