"""The step call (``flowkit/_replay/steps.py``): memoization across suspensions, retry policies
with durable backoff, and ``engine.retry`` of a failed run (only the failed step runs again)."""

from __future__ import annotations

from collections import Counter

import pytest

import flowkit
from flowkit import RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv

# -- memoization across a sleep and a signal wait --------------------------------------


@workflow(name="memo")
class Memo:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def work(self, tag: str) -> str:
        self.calls[tag] += 1
        return tag.upper()

    async def run(self, ctx: WorkflowCtx, input: None) -> list[str]:
        a = await ctx.step(self.work, "a")
        await ctx.sleep(10)
        b = await ctx.step(self.work, "b")
        got = await ctx.wait_for_signal("go")
        c = await ctx.step(self.work, "c")
        return [a, b, got, c]


async def test_steps_are_not_reexecuted_after_sleep_and_signal() -> None:
    wf = Memo()
    async with TestEnv([wf]) as env:
        await env.start("memo", None, "r1")
        run = await env.get_run("r1")
        assert run.status is RunStatus.SUSPENDED
        assert wf.calls == {"a": 1}

        await env.advance(10)
        assert wf.calls == {"a": 1, "b": 1}
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED

        await env.signal("r1", "go", "sig")
        assert await env.result("r1") == ["A", "B", "sig", "C"]
        assert wf.calls == {"a": 1, "b": 1, "c": 1}
        h = await env.history("r1")
        assert h.types.count("step_completed") == 3
        assert h.types[-1] == "run_completed"


# -- retry policies ---------------------------------------------------------------------


@workflow(name="flaky")
class Flaky:
    def __init__(self, fail_times: int, policy: RetryPolicy, exc: type[Exception]) -> None:
        self.fail_times = fail_times
        self.policy = policy
        self.exc = exc
        self.attempt_times: list[float] = []
        self.clock: flowkit.Clock | None = None

    def call(self) -> str:
        assert self.clock is not None
        self.attempt_times.append(self.clock.now())
        if len(self.attempt_times) <= self.fail_times:
            raise self.exc(f"boom #{len(self.attempt_times)}")
        return "ok"

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        return await ctx.step(self.call, name="call", retry=self.policy)


def _step_events(h: flowkit.History, type_: str) -> list[flowkit.Event]:
    return [e for e in h if e.type == type_]


async def test_step_fails_twice_then_succeeds_with_durable_backoff() -> None:
    policy = RetryPolicy(max_attempts=3, initial_interval=1, backoff=3, max_interval=100)
    wf = Flaky(2, policy, RuntimeError)
    async with TestEnv([wf]) as env:
        wf.clock = env.clock
        t0 = env.clock.now()
        await env.start("flaky", None, "r1")
        # first attempt failed: the run is suspended until t0 + 1 (not waiting in memory)
        run = await env.get_run("r1")
        assert run.status is RunStatus.SUSPENDED
        assert run.lease_owner is None
        assert run.wake_at == pytest.approx(t0 + 1)
        assert len(wf.attempt_times) == 1

        await env.advance(0.5)
        assert len(wf.attempt_times) == 1
        await env.advance(0.5)
        assert len(wf.attempt_times) == 2
        run = await env.get_run("r1")
        assert run.status is RunStatus.SUSPENDED
        assert run.wake_at == pytest.approx(t0 + 1 + 3)  # backoff 3 => 1 * 3

        await env.advance(2.9)
        assert len(wf.attempt_times) == 2
        await env.advance(0.1)
        assert await env.result("r1") == "ok"
        assert wf.attempt_times == pytest.approx([t0, t0 + 1, t0 + 4])

        h = await env.history("r1")
        failed = _step_events(h, "step_failed")
        done = _step_events(h, "step_completed")
        assert len(failed) == 2 and len(done) == 1
        assert [f.attempt for f in failed] == [1, 2]
        assert [f.retry_at for f in failed] == pytest.approx([t0 + 1, t0 + 4])
        assert [f.at for f in failed] == pytest.approx([t0, t0 + 1])
        assert failed[0].error.type == "RuntimeError"
        assert failed[0].error.message == "boom #1"
        assert done[0].attempt == 3
        assert h.types[-1] == "run_completed"


async def test_every_attempt_of_a_step_records_the_same_argument_digest() -> None:
    """The digest is taken once per ``ctx.step`` call: a step that changes its own argument
    between attempts (retried at once, in one activation) does not change it."""
    seen: list[int] = []

    def grow(items: list[int]) -> int:
        items.append(len(items))
        seen.append(len(items))
        if len(seen) < 3:
            raise RuntimeError("again")
        return len(items)

    @workflow(name="grows")
    class Grows:
        async def run(self, ctx: WorkflowCtx, input: None) -> int:
            policy = RetryPolicy(max_attempts=3, initial_interval=0)
            return int(await ctx.step(grow, [], retry=policy))

    async with TestEnv([Grows()]) as env:
        await env.start("grows", None, "r1")
        assert await env.result("r1") == 3
        h = await env.history("r1")
        digests = [e.args_digest for e in h if e.type in ("step_failed", "step_completed")]
        assert len(digests) == 3 and len(set(digests)) == 1, digests
        assert seen == [1, 2, 3]


async def test_backoff_is_capped_by_max_interval() -> None:
    policy = RetryPolicy(max_attempts=5, initial_interval=2, backoff=10, max_interval=5)
    wf = Flaky(4, policy, RuntimeError)
    async with TestEnv([wf]) as env:
        wf.clock = env.clock
        await env.start("flaky", None, "r1")
        assert await env.result("r1") == "ok"
        gaps = [b - a for a, b in zip(wf.attempt_times, wf.attempt_times[1:], strict=False)]
        assert gaps == pytest.approx([2, 5, 5, 5])
        failed = _step_events(await env.history("r1"), "step_failed")
        assert [f.retry_at - f.at for f in failed] == pytest.approx([2, 5, 5, 5])


async def test_non_retryable_exception_fails_at_once() -> None:
    policy = RetryPolicy(max_attempts=5, initial_interval=1, non_retryable=(KeyError,))
    wf = Flaky(10, policy, KeyError)
    async with TestEnv([wf]) as env:
        wf.clock = env.clock
        await env.start("flaky", None, "r1")
        await env.run_until_idle()
        assert len(wf.attempt_times) == 1
        assert (await env.get_run("r1")).status is RunStatus.FAILED
        failed = _step_events(await env.history("r1"), "step_failed")
        assert len(failed) == 1 and failed[0].retry_at is None


async def test_exhausted_retries_fail_the_run_with_step_failed_cause() -> None:
    policy = RetryPolicy(max_attempts=3, initial_interval=1)
    wf = Flaky(99, policy, ConnectionError)
    async with TestEnv([wf]) as env:
        wf.clock = env.clock
        await env.start("flaky", None, "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await env.result("r1")
        assert len(wf.attempt_times) == 3
        cause = ei.value.cause
        assert isinstance(cause, flowkit.StepFailedError)
        assert cause.error_type == "ConnectionError"
        assert cause.message == "boom #3"
        assert cause.step == "call"
        assert cause.attempts == 3
        h = await env.history("r1")
        assert h.types[-1] == "run_failed"
        assert [f.retry_at is None for f in _step_events(h, "step_failed")] == [
            False,
            False,
            True,
        ]


# -- engine.retry ---------------------------------------------------------------------------


@workflow(name="retryable")
class Retryable:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def first(self) -> int:
        self.calls["first"] += 1
        return 1

    def second(self) -> int:
        self.calls["second"] += 1
        if self.calls["second"] == 1:
            raise RuntimeError("transient")
        return 2

    async def run(self, ctx: WorkflowCtx, input: bool) -> int:
        """``input``: whether the output includes ``ctx.attempt``."""
        a = await ctx.step(self.first)
        await ctx.sleep(5)
        b = await ctx.step(self.second)
        return a + b + (ctx.attempt * 100 if input else 0)


async def test_engine_retry_reruns_only_the_failed_step() -> None:
    wf = Retryable()
    async with TestEnv([wf]) as env:
        await env.start("retryable", True, "r1")
        await env.run_until_idle()
        run = await env.get_run("r1")
        assert run.status is RunStatus.FAILED
        assert run.error is not None and run.error["cause_type"] == "RuntimeError"
        before = (await env.history("r1")).types

        retried = await env.retry("r1")
        assert retried.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.COMPLETED)
        assert await env.result("r1") == 203
        assert wf.calls == {"first": 1, "second": 2}
        h = await env.history("r1")
        assert h.types[: len(before)] == before
        assert h.types[len(before)] == "run_retried"
        assert h.types[-2:] == ["step_completed", "run_completed"]
        assert [e.seq for e in h] == list(range(1, len(h) + 1))


async def _retried_history(use_attempt: bool) -> flowkit.History:
    async with TestEnv([Retryable()]) as env:
        await env.start("retryable", use_attempt, "r1")
        await env.run_until_idle()
        await env.retry("r1")
        await env.result("r1")
        return await env.history("r1")


async def test_replay_of_a_retried_run_passes() -> None:
    h = await _retried_history(False)
    assert "run_retried" in h.types
    await flowkit.replay_async(h, Retryable)


async def test_replay_of_a_retried_run_sees_its_attempt() -> None:
    h = await _retried_history(True)
    await flowkit.replay_async(h, Retryable)


async def test_retry_of_non_failed_run_raises_run_state_error() -> None:
    wf = Retryable()
    async with TestEnv([wf]) as env:
        await env.start("retryable", True, "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        with pytest.raises(flowkit.RunStateError):
            await env.engines[0].retry("r1")
        wf.calls["second"] = 1  # the next call succeeds
        assert await env.result("r1") == 103
        n = len(await env.history("r1"))
        with pytest.raises(flowkit.RunStateError):
            await env.engines[0].retry("r1")
        assert len(await env.history("r1")) == n
        with pytest.raises(flowkit.RunNotFoundError):
            await env.engines[0].retry("nope")
