"""A worker process for tests/test_process_crash.py.

``python tests/crash_worker.py URL MARKER_DIR INSTANCE_ID RUN_ID [--block] [--lease-ttl S]``
runs one Engine (``lease_ttl=2`` unless given, ``poll_interval=0.1``) on ``SqlStore(URL)``
until run ``RUN_ID`` has settled, then exits 0. The ``crash3`` workflow runs three steps;
each execution of step N first appends one line (``<instance> <pid> <unix time>``) to
``MARKER_DIR/stepN.log``. With ``--block``, step 2 then sleeps 60 s: the test kills the
process with SIGKILL while it sleeps, and a second worker (without ``--block``) takes the run
over once the lease has expired (or at once, when it has the dead worker's instance id)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

LEASE_TTL = 2.0
POLL_INTERVAL = 0.1
WORKFLOW = "crash3"


class CrashIn(BaseModel):
    n: int


def mark(marker_dir: Path, step: str, instance: str) -> None:
    """Append one line and make it durable before the step goes on."""
    with open(marker_dir / f"{step}.log", "a") as f:
        f.write(f"{instance} {os.getpid()} {time.time():.6f}\n")
        f.flush()
        os.fsync(f.fileno())


@workflow(name=WORKFLOW)
class Crash3:
    def __init__(self, marker_dir: Path, instance: str, block: bool) -> None:
        self.marker_dir = marker_dir
        self.instance = instance
        self.block = block

    def step1(self, n: int) -> int:
        mark(self.marker_dir, "step1", self.instance)
        return n + 1

    async def step2(self, n: int) -> int:
        mark(self.marker_dir, "step2", self.instance)
        if self.block:
            await asyncio.sleep(60)  # killed here by the test
        return n * 10

    def step3(self, n: int) -> int:
        mark(self.marker_dir, "step3", self.instance)
        return n + 3

    async def run(self, ctx: WorkflowCtx, input: CrashIn) -> list[int]:
        a = await ctx.step(self.step1, input.n)
        b = await ctx.step(self.step2, a)
        c = await ctx.step(self.step3, b)
        return [a, b, c]


async def main(
    url: str,
    marker_dir: Path,
    instance: str,
    run_id: str,
    block: bool,
    lease_ttl: float = LEASE_TTL,
) -> int:
    store = SqlStore(url)
    engine = Engine(
        store,
        [Crash3(marker_dir, instance, block)],
        instance_id=instance,
        lease_ttl=lease_ttl,
        poll_interval=POLL_INTERVAL,
    )
    deadline = time.monotonic() + 60
    try:
        async with engine:
            print(f"{instance} ready pid={os.getpid()}", flush=True)
            while time.monotonic() < deadline:
                run = await store.get_run(run_id)
                if run is not None and run.status.terminal:
                    print(f"{instance} saw {run_id} {run.status}", flush=True)
                    return 0
                await asyncio.sleep(0.1)
        print(f"{instance} gave up waiting for {run_id}", flush=True)
        return 1
    finally:
        store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("marker_dir", type=Path)
    p.add_argument("instance")
    p.add_argument("run_id")
    p.add_argument("--block", action="store_true")
    p.add_argument("--lease-ttl", type=float, default=LEASE_TTL)
    a = p.parse_args()
    sys.exit(asyncio.run(main(a.url, a.marker_dir, a.instance, a.run_id, a.block, a.lease_ttl)))
