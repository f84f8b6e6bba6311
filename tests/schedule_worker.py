"""A worker process for tests/test_schedules_processes.py: an engine on ``URL`` that declares
``Engine(schedules={"tick": Schedule(every=1)})`` and serves for ``SECONDS`` real seconds."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from flowkit import Engine, Schedule, workflow
from flowkit.stores import SqlStore


@workflow(name="tick")
class Tick:
    async def run(self, ctx: Any, input: Any) -> Any:
        return input


async def main(url: str, instance: str, seconds: float) -> None:
    # (catchup_window: a tick a busy machine delays past the next one still starts)
    sched = {"tick": Schedule("tick", every=1, overlap="allow", input=instance, catchup_window=30)}
    store = SqlStore(url)
    engine = Engine(store, [Tick], instance_id=instance, poll_interval=0.2, schedules=sched)
    async with engine:
        await asyncio.sleep(seconds)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
