"""What tools (``flowkit_testing.TestEnv``) see of an engine's worker: ``executing``,
``poke`` and ``crash``; and the engine's settings, which live in the ``WorkerConfig`` its
worker runs with, so that a change reaches a running worker."""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit import Engine, RunStatus, WorkflowCtx, workflow
from flowkit._worker.runner import WorkerConfig
from flowkit.stores import MemoryStore
from flowkit_testing import TestEnv


def holding() -> tuple[Any, asyncio.Event]:
    release = asyncio.Event()

    @workflow(name="hold")
    class Hold:
        async def wait(self) -> str:
            await release.wait()
            return "held"

        async def run(self, ctx: WorkflowCtx, _: int) -> str:
            return str(await ctx.step(self.wait))

    return Hold(), release


async def test_executing_holds_from_the_claim_to_the_settlement() -> None:
    wf, release = holding()
    env = TestEnv()  # (its clock and settle() only)
    engine = Engine(MemoryStore(), [wf], clock=env.clock, poll_interval=None)
    assert not engine.executing("h")  # no worker
    async with engine:
        await engine.start("hold", 0, "h")
        assert engine.executing("h")  # created claimed: executing at once
        await env.settle()
        assert engine.executing("h")
        release.set()
        await env.settle()
        assert not engine.executing("h")
        assert await engine.result("h", timeout=5) == "held"


async def test_crash_abandons_activations_and_keeps_their_leases() -> None:
    wf, release = holding()
    env = TestEnv()
    store = MemoryStore()
    engine = Engine(store, [wf], clock=env.clock, instance_id="i", poll_interval=None)
    await engine.start_worker()
    await engine.start("hold", 0, "h")
    await env.settle()
    await engine.crash()
    assert not engine.executing("h")
    engine.poke()  # (no worker: a no-op)
    release.set()
    await env.settle()
    run = await store.get_run("h")
    assert run is not None and (run.status, run.lease_owner) == (RunStatus.RUNNING, "i")
    assert [e.type for e in await store.load_events("h")] == ["run_started"]
    await engine.crash()  # (twice: a no-op)

    async with engine:  # a worker again, under the same id: it takes its leases back
        await env.settle()
        assert await engine.result("h", timeout=5) == "held"


async def test_poke_makes_the_worker_poll_the_store_now() -> None:
    wf, release = holding()
    release.set()
    env = TestEnv()
    store = MemoryStore()
    client = Engine(store, [wf], clock=env.clock, worker=False)
    async with Engine(store, [wf], clock=env.clock, poll_interval=None) as engine:
        await env.settle()
        await client.start("hold", 0, "p")  # pending: nothing tells the worker
        await env.settle()
        assert (await store.get_run("p")).status is RunStatus.PENDING  # type: ignore[union-attr]
        engine.poke()
        await env.settle()
        assert (await store.get_run("p")).status is RunStatus.COMPLETED  # type: ignore[union-attr]


async def test_the_settings_are_the_worker_config() -> None:
    wf, release = holding()
    store = MemoryStore()
    engine = Engine(store, [wf], lease_ttl=5, max_concurrency=3, notify_on_release=False)
    cfg = engine.config
    assert isinstance(cfg, WorkerConfig)
    assert (cfg.store, cfg.lease_ttl, cfg.max_concurrency, cfg.notify_on_release) == (
        store,
        5,
        3,
        False,
    )
    assert engine.store is store and engine.registry is cfg.registry and "hold" in cfg.registry
    assert cfg.instance_id == engine.instance_id and engine.instance_id.startswith("engine-")
    async with engine:
        await engine.start("hold", 0, "h")
        assert engine._core.worker is not None and engine._core.worker.has_capacity()
        engine.max_concurrency = 1  # reaches the running worker
        assert cfg.max_concurrency == 1 and not engine._core.worker.has_capacity()
        release.set()
        assert await engine.result("h", timeout=5) == "held"
