"""Time skipping holds virtual time while a step runs (docs/testing.md, "Steps that do real
work"): ``TestEnv.run_until_idle`` / ``advance`` / ``result`` wait, in real time, for every
step attempt in flight before they move the virtual clock, so that a step's ``timeout=`` is
not reached by a jump while the step does real I/O. An attempt still running after
``TestEnv(hung_step_after=...)`` real seconds counts as hung: time skips on, and its timeout
fires on the virtual clock. Durable timers still skip at once.

Each behaviour runs on MemoryStore and on a SQLite file (the store is not what changed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit import RunStatus, StepFailedError, WorkflowCtx, workflow
from flowkit.events import StepCompleted, StepFailed, TimerFired
from flowkit_testing import TestEnv

try:
    from store_kit import Backend, make_backend
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend, make_backend


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


class Http:
    """Stands for an HTTP client: each call takes a little real time."""

    def __init__(self) -> None:
        self.calls = 0

    async def get(self, key: str) -> str:
        self.calls += 1
        await asyncio.sleep(0.05)  # the network, in real time
        return f"got {key}"

    async def get_in_thread(self, key: str) -> str:
        self.calls += 1
        return await asyncio.to_thread(self._blocking, key)

    def _blocking(self, key: str) -> str:
        time.sleep(0.05)
        return f"thread got {key}"

    def get_sync(self, key: str) -> str:
        self.calls += 1
        time.sleep(0.05)
        return f"sync got {key}"


@workflow(name="timed-http")
class TimedHttp:
    """Three steps bounded by 5 s each, beside a durable sleep of an hour."""

    def __init__(self, http: Http) -> None:
        self.http = http

    async def run(self, ctx: WorkflowCtx, key: str) -> list[str]:
        a = await ctx.step(self.http.get, key, timeout=5)
        b = await ctx.step(self.http.get_in_thread, key, timeout=5)
        c = await ctx.step(self.http.get_sync, key, timeout=5)
        await ctx.sleep(3600)
        d = await ctx.step(self.http.get, key, timeout=5)
        return [a, b, c, d]


def _steps(h: flowkit.History) -> list[Any]:
    return [e for e in h if isinstance(e, StepCompleted | StepFailed)]


async def test_a_timed_step_doing_real_io_completes_under_run_until_idle(
    backend: Backend,
) -> None:
    """The async step (a real ``asyncio.sleep``), the one awaiting a thread and the sync one
    all complete: virtual time stood still while they ran (each is recorded at the instant
    it started), and the durable sleep of an hour still skipped at once."""
    http = Http()
    async with TestEnv([TimedHttp(http)], store=backend.store) as env:
        t0 = env.clock.now()
        await env.start("timed-http", "k", "r1")
        await env.run_until_idle()
        run = await env.get_run("r1")
        assert run.status is RunStatus.COMPLETED, run.error
        assert run.output == ["got k", "thread got k", "sync got k", "got k"]
        h = await env.history("r1")
        steps = _steps(h)
        assert [type(s) for s in steps] == [StepCompleted] * 4
        assert [s.at for s in steps] == [t0, t0, t0, t0 + 3600]
        (fired,) = [e for e in h if isinstance(e, TimerFired)]
        assert fired.at == t0 + 3600
        assert env.clock.now() == t0 + 3600
        assert http.calls == 4


async def test_advance_waits_for_a_step_in_flight_too(backend: Backend) -> None:
    """``advance`` moves time only once the step ended: the step answered at the start
    instant, and the time moved by the whole amount after it."""
    http = Http()
    async with TestEnv([TimedHttp(http)], store=backend.store) as env:
        t0 = env.clock.now()
        await env.start("timed-http", "k", "r1")
        await env.advance(60)
        assert env.clock.now() == t0 + 60
        steps = _steps(await env.history("r1"))
        assert [(type(s), s.at) for s in steps] == [(StepCompleted, t0)] * 3
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED  # in its durable sleep


@workflow(name="io-beside-a-sleep")
class IoBesideASleep:
    """A timed step doing real I/O side by side with a durable sleep of 10 s."""

    def __init__(self, http: Http) -> None:
        self.http = http

    async def run(self, ctx: WorkflowCtx, key: str) -> str:
        got, _ = await ctx.gather(ctx.step(self.http.get, key, timeout=5), ctx.sleep(10))
        return str(got)


async def test_a_sleep_beside_a_running_step_waits_for_it(backend: Backend) -> None:
    """The sleep's due time and the step's deadline are both ahead: time skipping first lets
    the step end (at the start instant), then jumps to the sleep's end."""
    async with TestEnv([IoBesideASleep(Http())], store=backend.store) as env:
        t0 = env.clock.now()
        await env.start("io-beside-a-sleep", "k", "r1")
        assert await env.result("r1") == "got k"
        (done,) = _steps(await env.history("r1"))
        assert isinstance(done, StepCompleted) and done.at == t0
        assert env.clock.now() == t0 + 10


@workflow(name="hangs-then-answers")
class HangsThenAnswers:
    """A step that never answers, bounded by 30 s, then a step doing real I/O."""

    def __init__(self, http: Http) -> None:
        self.http = http
        self.never = asyncio.Event()

    async def hang(self) -> str:
        await self.never.wait()
        return "never"

    async def run(self, ctx: WorkflowCtx, key: str) -> str:
        try:
            await ctx.step(self.hang, timeout=30)
        except StepFailedError as err:
            assert err.error_type == "StepTimeoutError"
        return await ctx.step(self.http.get, key, timeout=5)


async def test_a_hung_step_still_times_out_on_the_virtual_clock(backend: Backend) -> None:
    """The step that never answers is waited for ``hung_step_after`` real seconds, then time
    skips to its deadline; the next step, doing real I/O, is held for again."""
    http = Http()
    async with TestEnv([HangsThenAnswers(http)], store=backend.store, hung_step_after=0.05) as env:
        t0 = env.clock.now()
        await env.start("hangs-then-answers", "k", "r1")
        assert await env.result("r1") == "got k"
        failed, done = _steps(await env.history("r1"))
        assert isinstance(failed, StepFailed) and failed.error.type == "StepTimeoutError"
        assert failed.at == t0 + 30
        assert isinstance(done, StepCompleted) and done.at == t0 + 30


async def test_settle_still_counts_a_step_awaiting_io_as_blocked(backend: Backend) -> None:
    """``settle`` returns while the async step awaits its I/O (virtual time stands still
    there anyway); the run is still in the step."""
    gate = asyncio.Event()

    @workflow(name="waits-for-gate")
    class WaitsForGate:
        async def wait(self) -> str:
            await gate.wait()
            return "opened"

        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            return await ctx.step(self.wait, timeout=5)

    async with TestEnv([WaitsForGate()], store=backend.store) as env:
        await env.start("waits-for-gate", None, "r1")
        await env.settle()
        assert (await env.get_run("r1")).status is RunStatus.RUNNING
        assert "step_completed" not in (await env.history("r1")).types
        gate.set()
        await env.run_until_idle()
        assert (await env.get_run("r1")).output == "opened"


def test_hung_step_after_must_be_a_number_of_seconds() -> None:
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(ValueError, match="hung_step_after"):
            TestEnv(hung_step_after=bad)
