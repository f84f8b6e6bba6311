"""Step timeouts (docs/writing-workflows.md, "Step timeouts and threads";
docs/writing-workflows.md, "Step timeouts"): ``ctx.step(..., timeout=s)`` bounds each attempt on
the engine's clock; an attempt that runs longer is cancelled (an async step) or abandoned in its
thread (a sync one) and fails with ``StepTimeoutError``, which the retry policy sees like any
failure, recorded so that a replay takes the same branch. In ``TestEnv`` virtual time drives them
like timers.

Each behaviour runs on MemoryStore and on a SQLite file."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import flowkit
from flowkit import (
    Engine,
    RetryPolicy,
    RunStatus,
    StepFailedError,
    StepTimeoutError,
    WorkflowCtx,
    WorkflowFailedError,
    workflow,
)
from flowkit.events import StepCompleted, StepFailed
from flowkit_testing import CrashSite, Rule, TestEnv

try:
    from store_kit import Backend, make_backend
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend, make_backend

HOUR = 3600.0
# the steps that hang here hang on purpose: time skipping waits only this long (real seconds)
# for one before it lets their timeout fire (docs/testing.md, "Steps that do real work")
HUNG = 0.05


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """MemoryStore, then SqlStore on a SQLite file (the store itself is not changed here)."""
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


class Remote:
    """A service whose first ``hangs`` calls never answer (an ``asyncio.Event`` nobody
    sets), and whose later calls answer at once."""

    def __init__(self, hangs: int = 1) -> None:
        self.hangs = hangs
        self.calls = 0
        self.cancelled = 0
        self.never = asyncio.Event()

    async def fetch(self, key: str) -> str:
        self.calls += 1
        if self.calls <= self.hangs:
            try:
                await self.never.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return f"value of {key}"


@workflow(name="fetcher")
class Fetcher:
    """A step bounded by an hour, retried by ``policy`` (none: one attempt); a final failure
    takes the fallback branch."""

    def __init__(self, remote: Remote, policy: RetryPolicy | None = None) -> None:
        self.remote = remote
        self.policy = policy

    async def run(self, ctx: WorkflowCtx, key: str) -> dict[str, Any]:
        try:
            value = await ctx.step(self.remote.fetch, key, timeout=HOUR, retry=self.policy)
        except StepFailedError as err:
            return {"fallback": True, "type": err.error_type, "attempts": err.attempts}
        return {"value": value}


def _steps(h: flowkit.History) -> list[Any]:
    return [e for e in h if isinstance(e, StepCompleted | StepFailed)]


async def test_virtual_time_drives_an_hour_long_timeout_and_the_retry_succeeds(
    backend: Backend,
) -> None:
    """The first attempt awaits an event that never fires: an hour of virtual time later it
    is cancelled and recorded as a ``StepTimeoutError``; the retry answers at once."""
    remote = Remote(hangs=1)
    wf = Fetcher(remote, RetryPolicy(max_attempts=3, initial_interval=10))
    async with TestEnv([wf], store=backend.store, hung_step_after=HUNG) as env:
        t0 = env.clock.now()
        await env.start("fetcher", "k", "r1")
        run = await env.get_run("r1")
        assert run.status is RunStatus.RUNNING  # in its first attempt
        # the attempt's deadline is a due time of the engine (TestEnv jumps to it)
        assert env.engines[0].retry_due() == t0 + HOUR
        assert await env.result("r1") == {"value": "value of k"}
        assert remote.calls == 2 and remote.cancelled == 1
        failed, done = _steps(await env.history("r1"))
        assert isinstance(failed, StepFailed) and isinstance(done, StepCompleted)
        assert failed.error.type == "StepTimeoutError"
        assert failed.error.message == "step 'Remote.fetch' timed out after 3600 s"
        assert (failed.attempt, failed.at, failed.retry_at) == (1, t0 + HOUR, t0 + HOUR + 10)
        assert not failed.cancelled  # a failure of the step, not the run's cancellation
        assert (done.attempt, done.at) == (2, t0 + HOUR + 10)
        assert env.engines[0].retry_due() is None  # no deadline left behind
        # a replay takes the same branch from the history alone
        await flowkit.replay_async(await env.history("r1"), Fetcher(Remote(hangs=99)))


async def test_a_final_timeout_raises_step_failed_in_the_body_and_replays(
    backend: Backend,
) -> None:
    remote = Remote(hangs=99)
    async with TestEnv([Fetcher(remote)], store=backend.store, hung_step_after=HUNG) as env:
        await env.start("fetcher", "k", "r1")
        assert await env.result("r1") == {
            "fallback": True,
            "type": "StepTimeoutError",
            "attempts": 1,
        }
        h = await env.history("r1")
        (failed,) = _steps(h)
        assert isinstance(failed, StepFailed) and failed.retry_at is None
        assert failed.error.type == "StepTimeoutError"
        # the replay takes the fallback branch too, with a service that would answer
        await flowkit.replay_async(h, Fetcher(Remote(hangs=0)))


@workflow(name="bare-fetch")
class BareFetch:
    """A timed step whose failure the body does not catch: the run fails."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    async def run(self, ctx: WorkflowCtx, key: str) -> str:
        return await ctx.step(self.remote.fetch, key, timeout=30, name="fetch")


async def test_engine_result_names_the_timeout_as_the_cause(backend: Backend) -> None:
    async with TestEnv(
        [BareFetch(Remote(hangs=99))], store=backend.store, hung_step_after=HUNG
    ) as env:
        await env.start("bare-fetch", "k", "r1")
        with pytest.raises(WorkflowFailedError) as caught:
            await env.result("r1")
        err = caught.value
        assert err.error["type"] == "StepFailedError"
        assert err.error["cause_type"] == "StepTimeoutError"
        assert err.error["cause_message"] == "step 'fetch' timed out after 30 s"
        assert isinstance(err.cause, StepFailedError)
        assert err.cause.error_type == "StepTimeoutError" and err.cause.step == "fetch"
        assert (await env.get_run("r1")).status is RunStatus.FAILED


async def test_non_retryable_timeouts_get_one_attempt(backend: Backend) -> None:
    remote = Remote(hangs=99)
    policy = RetryPolicy(max_attempts=5, non_retryable=(StepTimeoutError,))
    async with TestEnv([Fetcher(remote, policy)], store=backend.store, hung_step_after=HUNG) as env:
        await env.start("fetcher", "k", "r1")
        assert (await env.result("r1"))["attempts"] == 1
        assert remote.calls == 1


async def test_every_attempt_has_its_own_deadline(backend: Backend) -> None:
    """Three attempts time out, each an hour after it started (after its backoff)."""
    remote = Remote(hangs=99)
    policy = RetryPolicy(max_attempts=3, initial_interval=60, backoff=1)
    async with TestEnv([Fetcher(remote, policy)], store=backend.store, hung_step_after=HUNG) as env:
        t0 = env.clock.now()
        await env.start("fetcher", "k", "r1")
        assert (await env.result("r1"))["attempts"] == 3
        failures = _steps(await env.history("r1"))
        assert [f.at for f in failures] == [t0 + HOUR, t0 + 2 * HOUR + 60, t0 + 3 * HOUR + 120]
        assert [f.error.type for f in failures] == ["StepTimeoutError"] * 3
        assert remote.cancelled == 3


class Stubborn:
    """A step that swallows its cancellation and returns anyway."""

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def work(self) -> str:
        try:
            await self.never.wait()
        except asyncio.CancelledError:
            return "finished anyway"
        return "done"


@workflow(name="stubborn")
class StubbornFlow:
    def __init__(self, svc: Stubborn) -> None:
        self.svc = svc

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            return await ctx.step(self.svc.work, timeout=5)
        except StepFailedError as err:
            return err.error_type


async def test_a_step_that_swallows_the_cancellation_still_timed_out(backend: Backend) -> None:
    """Past its deadline the attempt has failed, whatever the function makes of its
    cancellation; the run goes on normally (not blocked as by a foreign cancellation)."""
    async with TestEnv(
        [StubbornFlow(Stubborn())], store=backend.store, hung_step_after=HUNG
    ) as env:
        await env.start("stubborn", None, "r1")
        assert await env.result("r1") == "StepTimeoutError"


@workflow(name="quick")
class Quick:
    """Steps that answer in time: the timeout never fires and leaves nothing behind."""

    async def add(self, a: int, b: int) -> int:
        return a + b

    def mul(self, a: int, b: int) -> int:
        return a * b

    async def run(self, ctx: WorkflowCtx, input: None) -> list[int]:
        a = await ctx.step(self.add, 1, 2, timeout=1)
        b = await ctx.step(self.mul, 3, 4, timeout=1)
        c = await ctx.gather(ctx.step(self.add, 5, 6, timeout=1), ctx.sleep(10))
        return [a, b, c[0]]


async def test_steps_that_answer_in_time_are_unaffected(backend: Backend) -> None:
    async with TestEnv([Quick()], store=backend.store, hung_step_after=HUNG) as env:
        await env.start("quick", None, "r1")
        assert await env.result("r1") == [3, 12, 11]
        assert env.engines[0].retry_due() is None
        assert (await env.history("r1")).types.count("step_failed") == 0


async def test_the_runs_cancellation_during_a_timed_step_is_a_cancellation(
    backend: Backend,
) -> None:
    """The run's cancellation and the timeout are told apart: cancelled, not timed out."""
    remote = Remote(hangs=99)
    async with TestEnv([Fetcher(remote)], store=backend.store, hung_step_after=HUNG) as env:
        await env.start("fetcher", "k", "r1")
        await env.advance(60)
        await env.cancel("r1")
        await env.run_until_idle()
        assert (await env.get_run("r1")).status is RunStatus.CANCELLED
        (failed,) = _steps(await env.history("r1"))
        assert isinstance(failed, StepFailed)
        assert failed.cancelled and failed.error.type == "CancelledError"
        assert env.engines[0].retry_due() is None


@workflow(name="outer-timeout")
class OuterTimeout:
    """``asyncio.timeout`` around a timed step: still refused (not recorded)."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            async with asyncio.timeout(0):
                return await ctx.step(self.remote.fetch, "k", timeout=HOUR)
        except TimeoutError:
            return "timed out"


async def test_a_foreign_timeout_around_a_timed_step_still_blocks_the_run(
    backend: Backend,
) -> None:
    async with TestEnv(
        [OuterTimeout(Remote(hangs=99))], store=backend.store, hung_step_after=HUNG
    ) as env:
        await env.start("outer-timeout", None, "r1")
        run = await env.get_run("r1")
        assert run.status is RunStatus.BLOCKED
        assert run.error is not None and "ctx.step(fn, ..., timeout=seconds)" in str(run.error)
        assert "step_failed" not in (await env.history("r1")).types
        assert env.engines[0].retry_due() is None


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "5", True, None])
async def test_a_bad_timeout_is_a_value_error_that_records_nothing(
    backend: Backend, bad: Any
) -> None:
    """``None`` is the default (no timeout), and ``math.inf`` means the same; everything
    else not > 0 is refused as the call is made, before it takes a position."""
    seen: list[str] = []

    @workflow(name="bad-timeout")
    class BadTimeout:
        def work(self) -> str:
            return "ran"

        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            try:
                ctx.step(self.work, timeout=bad)  # type: ignore[unused-coroutine]
            except ValueError as err:
                seen.append(str(err))
            return await ctx.step(self.work)

    async with TestEnv([BadTimeout()], store=backend.store, hung_step_after=HUNG) as env:
        await env.start("bad-timeout", None, "r1")
        if bad is None or bad == math.inf:
            await env.run_until_idle()  # the unawaited call blocks the run: it was valid
            assert (await env.get_run("r1")).status is RunStatus.BLOCKED
            assert seen == []
            return
        assert await env.result("r1") == "ran"
        assert len(seen) == 1 and "timeout= takes seconds > 0" in seen[0]
        (done,) = _steps(await env.history("r1"))
        assert done.pos == "1"  # the refused call took no position


# -- crashes --------------------------------------------------------------------------------


def _records_timeout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A store call that records a timed-out attempt (``commit`` or ``append_events``)."""
    for value in (*args, *kwargs.values()):
        events = getattr(value, "events", value)
        if isinstance(events, list | tuple) and any(
            isinstance(e, StepFailed) and e.error.type == "StepTimeoutError" for e in events
        ):
            return True
    return False


async def test_a_crash_during_a_timed_attempt_restarts_it_with_a_fresh_deadline(
    backend: Backend,
) -> None:
    """A deadline lives in its process: the worker dies ten minutes into the attempt; the
    recovered run starts the attempt over, with the whole timeout again (nothing was
    recorded of the first one)."""
    remote = Remote(hangs=2)
    wf = Fetcher(remote, RetryPolicy(max_attempts=2, initial_interval=10))
    async with TestEnv([wf], store=backend.store, hung_step_after=HUNG) as env:
        t0 = env.clock.now()
        await env.start("fetcher", "k", "r1")
        await env.advance(600)
        await env.crash(0)
        assert env.engines[0].retry_due() is None
        await env.restart(0)
        assert await env.result("r1") == {"value": "value of k"}
        failed, done = _steps(await env.history("r1"))
        assert isinstance(failed, StepFailed) and failed.error.type == "StepTimeoutError"
        # recovered when the dead worker's lease expired (30 s after its last renewal)
        assert t0 + 600 < failed.at - HOUR <= t0 + 600 + env.lease_ttl
        assert failed.attempt == 1 and done.attempt == 2
        assert remote.calls == 3  # the crashed attempt, its re-run, the retry


async def test_a_crash_while_recording_the_timeout_times_the_attempt_out_again(
    backend: Backend,
) -> None:
    """The worker dies as it records the timed-out attempt: nothing of it is durable, so the
    recovered run runs the attempt again; its own timeout is recorded once."""
    remote = Remote(hangs=2)
    wf = Fetcher(remote, RetryPolicy(max_attempts=2, initial_interval=10))
    async with TestEnv([wf], store=backend.store, hung_step_after=HUNG) as env:
        env.inject(
            Rule(
                "append_events",
                "crash",
                "before",
                instance=0,
                match=_records_timeout,
                also=(CrashSite("commit", "before", _records_timeout),),
            )
        )
        await env.start("fetcher", "k", "r1")
        await env.advance(HOUR)
        assert env.crashed == [0]
        await env.restart(0)
        assert await env.result("r1") == {"value": "value of k"}
        failures = [e for e in _steps(await env.history("r1")) if isinstance(e, StepFailed)]
        assert [(f.attempt, f.error.type) for f in failures] == [(1, "StepTimeoutError")]
        assert remote.calls == 3


# -- sync steps, on the real clock ------------------------------------------------------------


class Blocking:
    """A sync step that blocks its thread until ``release`` is set (a hung HTTP call)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()
        self.calls = 0

    def call(self, key: str) -> str:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.release.wait(timeout=30)
            self.returned.set()
            return "too late"
        return f"second try {key}"


@workflow(name="blocking")
class BlockingFlow:
    def __init__(self, svc: Blocking) -> None:
        self.svc = svc

    async def run(self, ctx: WorkflowCtx, key: str) -> str:
        return await ctx.step(
            self.svc.call, key, timeout=0.2, retry=RetryPolicy(max_attempts=2, initial_interval=0)
        )


async def test_a_sync_step_that_times_out_is_abandoned_in_its_thread(backend: Backend) -> None:
    """The thread cannot be killed: the attempt is abandoned (its late result ignored), the
    retry runs in another thread, and the run completes while the first still blocks."""
    svc = Blocking()
    try:
        async with Engine(backend.store, [BlockingFlow(svc)], poll_interval=0.05) as engine:
            await engine.start("blocking", "k", "r1")
            assert await engine.result("r1", timeout=30) == "second try k"
            assert svc.entered.is_set() and not svc.returned.is_set()  # still blocked
            h = await engine.history("r1")
            failed, done = _steps(h)
            assert isinstance(failed, StepFailed) and failed.error.type == "StepTimeoutError"
            assert failed.error.message == "step 'Blocking.call' timed out after 0.2 s"
            assert isinstance(done, StepCompleted) and done.result == "second try k"
            # the engine stops without waiting for the abandoned thread
        assert not svc.returned.is_set()
    finally:
        svc.release.set()
    assert svc.returned.wait(timeout=30)
    # its late "too late" was never recorded
    await flowkit.replay_async(h, BlockingFlow(Blocking()))
    assert all(getattr(e, "result", None) != "too late" for e in h)
