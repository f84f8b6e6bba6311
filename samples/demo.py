"""Live demo of singleton lanes: three store keys, one slot each, a burst on store:A.

Run it with ``make demo`` (or ``python samples/demo.py [--fast]``). It shows, per lane, the run
holding the slot and the runs queued behind it; handovers happen the moment a holder settles
(notify-on-release); one start past ``max_queue_depth`` is rejected; at the end one run's
history shows its gate events."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from rich.live import Live
from rich.table import Table

from flowkit import (
    ADMITTED_TAG,
    Engine,
    RunStatus,
    Singleton,
    SingletonQueueFullError,
    WorkflowCtx,
    workflow,
)
from flowkit.stores import SqlStore

KEYS = ("A", "B", "C")


class SyncInput(BaseModel):
    store_id: str
    items: int = 3


class Inventory:
    """Pretend inventory service: each call takes a little real time."""

    def __init__(self, work: float) -> None:
        self.work = work
        self.active: dict[str, int] = {}
        self.max_overlap: dict[str, int] = {}

    async def pull(self, store_id: str, items: int) -> list[int]:
        self.active[store_id] = self.active.get(store_id, 0) + 1
        self.max_overlap[store_id] = max(self.max_overlap.get(store_id, 0), self.active[store_id])
        await asyncio.sleep(self.work)
        return list(range(items))

    async def reconcile(self, store_id: str, stock: list[int]) -> int:
        await asyncio.sleep(self.work)
        self.active[store_id] -= 1
        return len(stock)


@workflow(
    name="sync-inventory",
    singleton=Singleton(key=lambda inp: f"store:{inp.store_id}", limit=1, max_queue_depth=3),
)
class SyncInventory:
    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory

    async def run(self, ctx: WorkflowCtx, input: SyncInput) -> int:
        stock = await ctx.step(self.inventory.pull, input.store_id, input.items)
        return await ctx.step(self.inventory.reconcile, input.store_id, stock)


async def lanes_table(engine: Engine, started: float) -> Table:
    table = Table(title=f"singleton lanes  (t = {time.perf_counter() - started:4.1f} s)")
    table.add_column("lane")
    table.add_column("holder")
    table.add_column("queue (oldest first)")
    table.add_column("done")
    runs = await engine.list_runs(workflow="sync-inventory")
    for key in KEYS:
        lane = [r for r in runs if r.singleton_key == f"store:{key}"]
        holder = [r.id for r in lane if ADMITTED_TAG in r.tags and r.status.active]
        queue = [r.id for r in lane if ADMITTED_TAG not in r.tags and r.status.active]
        done = [r.id for r in lane if r.status is RunStatus.COMPLETED]
        table.add_row(
            f"store:{key}", ", ".join(holder) or "-", ", ".join(queue) or "-", str(len(done))
        )
    return table


async def lanes_line(engine: Engine) -> str:
    """One line per state change, for logs and pipes."""
    runs = await engine.list_runs(workflow="sync-inventory")
    parts = []
    for key in KEYS:
        lane = [r for r in runs if r.singleton_key == f"store:{key}" and r.status.active]
        holder = next((r.id for r in lane if ADMITTED_TAG in r.tags), "-")
        queue = ",".join(r.id for r in lane if ADMITTED_TAG not in r.tags)
        parts.append(f"{key}: {holder:<4}" + (f" <- {queue}" if queue else ""))
    return " | ".join(parts)


async def main(fast: bool, workdir: str) -> int:
    console = Console()
    inventory = Inventory(work=0.05 if fast else 0.6)
    db_path = Path(workdir) / "flowkit-demo.db"
    engine = Engine(SqlStore(f"sqlite:///{db_path}"), [SyncInventory(inventory)], poll_interval=0.2)
    started = time.perf_counter()
    console.print(
        "[bold]flowkit demo[/]: sync-inventory, "
        "Singleton(key=store:<id>, limit=1, max_queue_depth=3)"
    )
    console.print(f"store: embedded SQLite file {db_path}")
    async with engine:
        ids = [f"A-{i}" for i in range(1, 5)]
        for run_id in ids:  # a burst on store:A: one holder, three queued
            await engine.start("sync-inventory", {"store_id": "A"}, run_id)
        try:
            await engine.start("sync-inventory", {"store_id": "A"}, "A-5")
        except SingletonQueueFullError as exc:
            console.print(
                f"[red]rejected A-5[/]: {exc.key} is full (max_queue_depth={exc.max_queue_depth})"
            )
        for key in ("B", "C"):
            await engine.start("sync-inventory", {"store_id": key}, f"{key}-1")
        all_ids = [*ids, "B-1", "C-1"]
        live = console.is_terminal
        first = await lanes_table(engine, started)
        with Live(first, console=console, refresh_per_second=8) if live else _Null() as view:
            last = ""
            while True:
                runs = [await engine.get_run(r) for r in all_ids]
                if view is not None:
                    view.update(await lanes_table(engine, started))
                else:
                    line = await lanes_line(engine)
                    if line != last:
                        console.print(f"t={time.perf_counter() - started:4.1f}s  {line}")
                        last = line
                if all(r.status.terminal for r in runs):
                    break
                await asyncio.sleep(0.02)
        history = await engine.history("A-2")
        console.print(
            "\n[bold]history of A-2[/] (gated behind A-1, admitted the moment A-1 released):"
        )
        for ev in history:
            console.print(f"  {ev.seq:>2}  {ev.type:<20} +{ev.at - history[0].at:6.3f} s")
        admitted = [
            e.at for r in ids for e in await engine.history(r) if e.type == "singleton_admitted"
        ]
        released = [
            e.at for r in ids for e in await engine.history(r) if e.type == "singleton_released"
        ]
        handovers = [a - r for r, a in zip(released, admitted[1:], strict=False)]
        if handovers:
            worst = max(handovers) * 1000
            console.print(f"\nhandover on store:A (release -> next admission): max {worst:.1f} ms")
    overlap = max(inventory.max_overlap.values())
    console.print(f"max concurrent runs per key: {overlap}  (must be 1)")
    console.print(f"finished in {time.perf_counter() - started:.1f} s")
    return 0 if overlap == 1 else 1


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", action="store_true", help="short steps, no live view (for tests)")
    fast = parser.parse_args().fast
    with tempfile.TemporaryDirectory(prefix="flowkit-demo-") as tmp:
        code = asyncio.run(main(fast, tmp))
    sys.exit(code)
