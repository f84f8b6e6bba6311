"""meter_loop: a workflow that loops forever and keeps its history short (continue-as-new).

``MeterReader`` is a singleton per meter: it reads the meter in a loop and, every
``READS_PER_RUN`` reads, continues as new (``ctx.continue_as_new``) with its running total, so
no run's history grows past one batch of reads. The chain's runs are ``meter-7``,
``meter-7~1``, ``meter-7~2``, ...; each one hands the meter's singleton slot straight to the
next, so a second reader of the same meter started meanwhile waits until the chain ends.

It runs on the real ``Engine`` over a SQLite file in a temporary directory. At the end it
checks its own claims: every run's history is bounded, ``engine.result`` of the first id
answers with the chain's result, and the second reader ran only after the chain ended.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from pydantic import BaseModel

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores import SqlStore

READS_PER_RUN = 20
TOTAL_READS = 100


class Meter(BaseModel):
    meter: str
    reads: int = 0
    total: int = 0


@workflow(name="meter-reader", singleton=Singleton(key=lambda m: m.meter))
class MeterReader:
    async def read(self, meter: str, n: int) -> int:
        return n % 7  # stands for a call to the meter

    async def run(self, ctx: WorkflowCtx, input: Meter) -> int:
        reads, total = input.reads, input.total
        while reads < TOTAL_READS:
            total += await ctx.step(self.read, input.meter, reads)
            reads += 1
            if reads % READS_PER_RUN == 0 and reads < TOTAL_READS:
                # the rest of the loop goes on in a fresh run, with a fresh history
                ctx.continue_as_new(Meter(meter=input.meter, reads=reads, total=total))
        return total


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{Path(tmp) / 'meters.db'}")
        try:
            async with Engine(store, [MeterReader()]) as engine:
                await engine.start("meter-reader", {"meter": "m7"}, "meter-7")
                await engine.start("meter-reader", {"meter": "m7", "reads": 99}, "late")
                total = await engine.result("meter-7", timeout=30)  # follows the chain
                late = await engine.result("late", timeout=30)
                chain = ["meter-7", *(f"meter-7~{n}" for n in range(1, 5))]
                for run_id in chain:
                    run = await engine.get_run(run_id)
                    events = (await engine.history(run_id)).events
                    print(f"{run_id:10} {run.status:10} {len(events):3} events", end="")
                    print(f"  -> {run.continued_as}" if run.continued_as else "")
                    # run_started, singleton_admitted, the reads, singleton_released,
                    # run_continued, run_completed
                    assert len(events) <= READS_PER_RUN + 5
                last = await engine.get_run(chain[-1])
                late_run = (await engine.history("late")).events
                admitted = next(e.at for e in late_run if e.type == "singleton_admitted")
                assert admitted >= last.updated_at, "the late reader overtook the chain"
                assert total == sum(n % 7 for n in range(TOTAL_READS))
                print(f"total {total}; the late reader read {late}")
                print("ok: every history stayed bounded and the slot stayed with the chain")
        finally:
            store.close()


if __name__ == "__main__":
    asyncio.run(main())
