"""Sync steps never run on the event loop (docs/writing-workflows.md, "Step timeouts and threads";
docs/ writing-workflows.md, "Sync steps run in threads"): a synchronous step function runs in one of
the engine's step threads (``Engine(step_threads=N)``), so a blocking call in one run does not
stall the others; an async one runs on the loop. Concurrency is asserted structurally (who is
inside a function at once, with barriers), never by timing; bench/sync_steps_bench.py measures.

Each behaviour runs on MemoryStore and on a SQLite file."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit import Engine, WorkflowCtx, workflow
from flowkit._core.serde import is_async
from flowkit._worker.step_threads import DEFAULT_STEP_THREADS, StepThreads, steps_in_threads
from flowkit_testing import TestEnv

try:
    from store_kit import Backend, make_backend
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend, make_backend

WAIT = 30.0  # seconds a barrier or event may take before the test fails (never reached)


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


def _engine(backend: Backend, workflows: list[Any], **kw: Any) -> Engine:
    return Engine(backend.store, workflows, poll_interval=0.05, **kw)


# -- where a step runs ------------------------------------------------------------------------


class Where:
    """Steps of every shape, each saying which thread ran it."""

    async def coro(self) -> str:
        return threading.current_thread().name

    def plain(self) -> str:
        return threading.current_thread().name

    def returns_coroutine(self) -> Any:
        return self.coro()  # a sync function returning an awaitable: awaited on the loop


class AsyncCallable:
    async def __call__(self) -> str:
        return threading.current_thread().name


class SyncCallable:
    def __call__(self) -> str:
        return threading.current_thread().name


async def _named(tag: str) -> str:
    return f"{tag}:{threading.current_thread().name}"


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("REQUEST", default="none")


def _reads_context() -> str:
    return REQUEST.get()


@workflow(name="where")
class WhereFlow:
    def __init__(self) -> None:
        self.w = Where()

    async def run(self, ctx: WorkflowCtx, input: None) -> dict[str, str]:
        REQUEST.set("req-7")
        return {
            "coro": await ctx.step(self.w.coro),
            "plain": await ctx.step(self.w.plain),
            "returns_coroutine": await ctx.step(self.w.returns_coroutine),
            "async_callable": await ctx.step(AsyncCallable(), name="ac"),
            "sync_callable": await ctx.step(SyncCallable(), name="sc"),
            "partial": await ctx.step(functools.partial(_named, "p")),
            "lambda": await ctx.step(lambda: threading.current_thread().name, name="lam"),
            "context": await ctx.step(_reads_context),
        }


async def test_sync_steps_run_in_step_threads_and_async_ones_on_the_loop(
    backend: Backend,
) -> None:
    loop_thread = threading.current_thread().name
    async with _engine(backend, [WhereFlow()]) as engine:
        await engine.start("where", None, "r1")
        got = await engine.result("r1", timeout=WAIT)
        h = await engine.history("r1")
    on_loop = {"coro", "returns_coroutine", "async_callable"}
    for key in on_loop:
        assert got[key] == loop_thread, key
    assert got["partial"] == f"p:{loop_thread}"
    for key in ("plain", "sync_callable", "lambda"):
        assert got[key].startswith("flowkit-step-"), key
    assert got["context"] == "req-7"  # the body's contextvars reach the thread
    await flowkit.replay_async(h, WhereFlow())  # replay runs no step, in no thread


def test_is_async_decides_by_the_function_not_by_calling_it() -> None:
    w = Where()
    assert is_async(w.coro) and is_async(Where.coro)
    assert is_async(functools.partial(_named, "x"))
    assert is_async(functools.partial(functools.partial(_named), "x"))
    assert is_async(AsyncCallable())
    assert not is_async(w.plain) and not is_async(w.returns_coroutine)
    assert not is_async(SyncCallable()) and not is_async(len) and not is_async(dict)
    assert not is_async(functools.partial(w.plain))


# -- concurrency, structurally ---------------------------------------------------------------


class Crowd:
    """Sync steps that wait at a barrier: they get past it only when ``parties`` of them
    are inside at once; ``most`` is how many ever were."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=WAIT)
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def meet(self, i: int) -> int:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self.barrier.wait()
        finally:
            with self.lock:
                self.inside -= 1
        return i


@workflow(name="crowd")
class CrowdFlow:
    def __init__(self, crowd: Crowd) -> None:
        self.crowd = crowd

    async def run(self, ctx: WorkflowCtx, n: int) -> list[int]:
        return await ctx.gather(*(ctx.step(self.crowd.meet, i) for i in range(n)))


async def test_n_sync_steps_are_inside_their_functions_at_once(backend: Backend) -> None:
    """Four sync steps of one gather meet at a barrier of four: they run at once."""
    crowd = Crowd(4)
    async with _engine(backend, [CrowdFlow(crowd)], step_threads=4) as engine:
        await engine.start("crowd", 4, "r1")
        assert await engine.result("r1", timeout=WAIT) == [0, 1, 2, 3]
    assert crowd.most == 4


async def test_no_more_sync_steps_run_at_once_than_step_threads(backend: Backend) -> None:
    """Six steps, two threads, a barrier of two: they pass in pairs, never three inside."""
    crowd = Crowd(2)
    async with _engine(backend, [CrowdFlow(crowd)], step_threads=2) as engine:
        await engine.start("crowd", 6, "r1")
        assert await engine.result("r1", timeout=WAIT) == list(range(6))
    assert crowd.most == 2


async def test_sync_steps_of_different_runs_run_at_once(backend: Backend) -> None:
    """Three runs, one sync step each, a barrier of three."""
    crowd = Crowd(3)
    async with _engine(backend, [CrowdFlow(crowd)]) as engine:
        for i in range(3):
            await engine.start("crowd", 1, f"r{i}")
        for i in range(3):
            assert await engine.result(f"r{i}", timeout=WAIT) == [0]
    assert crowd.most == 3


class Hung:
    """A sync step that blocks its thread until released (a ``requests.get`` that hangs)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def call(self) -> str:
        self.entered.set()
        assert self.release.wait(timeout=WAIT)
        return "answered"


@workflow(name="hung")
class HungFlow:
    def __init__(self, hung: Hung) -> None:
        self.hung = hung

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        return await ctx.step(self.hung.call)


@workflow(name="busy")
class BusyFlow:
    def add(self, a: int, b: int) -> int:
        return a + b

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        total = 0
        for i in range(n):
            total = await ctx.step(self.add, total, i)
        return total


async def test_a_blocking_sync_step_does_not_stall_other_runs(backend: Backend) -> None:
    hung = Hung()
    try:
        async with _engine(backend, [HungFlow(hung), BusyFlow()]) as engine:
            await engine.start("hung", None, "stuck")
            assert await asyncio.to_thread(hung.entered.wait, WAIT)
            # the loop is free: other runs start, step and finish meanwhile
            for i in range(5):
                await engine.start("busy", 10, f"busy-{i}")
            for i in range(5):
                assert await engine.result(f"busy-{i}", timeout=WAIT) == 45
            assert not (await engine.get_run("stuck")).status.terminal
            hung.release.set()
            assert await engine.result("stuck", timeout=WAIT) == "answered"
    finally:
        hung.release.set()


async def test_test_env_waits_for_a_sync_step_in_its_thread(backend: Backend) -> None:
    """``TestEnv.settle`` counts a sync step in its thread as running: a test sees the run
    as it is once the step has returned, as it did when sync steps ran on the loop."""
    async with TestEnv([BusyFlow()], store=backend.store) as env:
        await env.start("busy", 20, "r1")  # (settles)
        assert (await env.get_run("r1")).status is flowkit.RunStatus.COMPLETED
        assert steps_in_threads() == []


# -- the engine keyword and the pool -----------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True, None])
def test_step_threads_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(ValueError, match="step_threads"):
        Engine(flowkit.stores.MemoryStore(), step_threads=bad)


def test_step_threads_default_and_setting() -> None:
    engine = Engine(flowkit.stores.MemoryStore())
    assert engine.step_threads == DEFAULT_STEP_THREADS == engine.config.step_threads
    engine.step_threads = 3
    assert engine.config.step_threads == 3


def test_step_threads_start_lazily_up_to_their_size_as_daemons() -> None:
    pool = StepThreads(2)
    gate = threading.Event()
    futs = [pool.submit(gate.wait, WAIT) for _ in range(3)]
    assert len(pool._threads) == 2 and all(t.daemon for t in pool._threads)
    gate.set()
    assert [f.result(timeout=WAIT) for f in futs] == [True] * 3
    assert len(pool._threads) == 2
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)


def test_shutdown_cancels_queued_calls_and_leaves_a_busy_thread_running() -> None:
    pool = StepThreads(1)
    entered, release = threading.Event(), threading.Event()

    def busy() -> str:
        entered.set()
        release.wait(WAIT)
        return "done"

    running = pool.submit(busy)
    queued = pool.submit(str, 1)
    assert entered.wait(WAIT)
    pool.shutdown()  # does not wait for the busy thread
    assert queued.cancelled() and not running.done()
    release.set()
    assert running.result(timeout=WAIT) == "done"


async def test_the_pool_ends_with_the_engine(backend: Backend) -> None:
    async with _engine(backend, [BusyFlow()], step_threads=2) as engine:
        await engine.start("busy", 3, "r1")
        assert await engine.result("r1", timeout=WAIT) == 3
        pool = engine._core.worker._drive.steps.pool  # type: ignore[union-attr]
        assert pool is not None and pool.size == 2
        threads = list(pool._threads)
    for t in threads:  # (idle threads end at once; joined to prove it)
        t.join(WAIT)
        assert not t.is_alive()
