"""Compensation (sagas): ``ctx.step(..., compensate=undo)`` registers ``undo(result)``; when the
body fails, or ``engine.cancel(run_id, compensate=True)`` cancels the run, the undos run in
reverse order as durable steps (``compensation_completed`` / ``compensation_failed`` at
positions ``c<n>``), retried by their step's policy, never twice after a crash, before the run
settles ``failed`` / ``cancelled`` (docs/composing-workflows.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import pytest

import flowkit
from flowkit import RetryPolicy, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.cli._out import _describe
from flowkit.events import CompensationCompleted, CompensationFailed
from flowkit_testing import TestEnv


class Agency:
    """The bookings: ``fail`` names the booking that cannot be made, ``undo_fails`` how many
    times each cancellation fails before it works (``None``: always)."""

    def __init__(self, fail: str = "car", undo_fails: dict[str, int | None] | None = None) -> None:
        self.fail = fail
        self.undo_fails = undo_fails or {}
        self.calls: Counter[str] = Counter()
        self.log: list[str] = []
        self.statuses: list[RunStatus] = []
        self.store: Any = None

    def book(self, what: str) -> str:
        self.calls[f"book {what}"] += 1
        if what == self.fail:
            raise LookupError(f"no {what} left")
        return f"{what}-1"

    def cancel(self, booking: str) -> str:
        self.calls[f"cancel {booking}"] += 1
        self.log.append(booking)
        what = booking.split("-")[0]
        if what in self.undo_fails:
            left = self.undo_fails[what]
            if left is None or self.calls[f"cancel {booking}"] <= left:
                raise ConnectionError(f"cannot cancel {booking}")
        return f"cancelled {booking}"

    async def cancel_seeing_status(self, booking: str) -> str:
        """An async undo that looks at its run's status (``cancelling`` while it undoes)."""
        run = await self.store.get_run("r")
        self.statuses.append(run.status)
        return self.cancel(booking)


RETRY = RetryPolicy(max_attempts=3, initial_interval=5.0)


@workflow(name="trip")
class Trip:
    """Books flight, hotel and car, each undone by ``cancel``; waits an hour between the hotel
    and the car (cancel it there). ``input``: "seq" (plain), "status" (async undos that note
    the run's status), "caught" (the failed car is caught, then a later failure), "gather"
    (flight and hotel booked concurrently)."""

    def __init__(self, agency: Agency) -> None:
        self.a = agency

    async def run(self, ctx: WorkflowCtx, mode: str) -> list[str]:
        a = self.a
        undo = a.cancel_seeing_status if mode == "status" else a.cancel
        if mode == "gather":
            flight, hotel = await ctx.gather(
                ctx.step(a.book, "flight", compensate=undo, retry=RETRY),
                ctx.step(a.book, "hotel", compensate=undo, retry=RETRY),
            )
        else:
            flight = await ctx.step(a.book, "flight", compensate=undo, retry=RETRY)
            hotel = await ctx.step(a.book, "hotel", compensate=undo, retry=RETRY)
        await ctx.sleep(3600)
        if mode == "caught":
            with contextlib.suppress(flowkit.StepFailedError):  # no car: a taxi will do
                await ctx.step(a.book, "car", compensate=undo)
            await ctx.step(a.book, "taxi", compensate=undo)
            raise RuntimeError("the taxi was not enough")
        car = await ctx.step(a.book, "car", compensate=undo)
        return [flight, hotel, car]


def _undos(history: Any) -> list[tuple[str, str, str]]:
    return [
        (e.type, e.pos, e.step_pos)
        for e in history
        if isinstance(e, CompensationCompleted | CompensationFailed)
    ]


async def _settle(env: TestEnv, run_id: str) -> Any:
    """Run (restarting crashed instances) until ``run_id`` settles."""
    for _ in range(50):
        if env.crashed:
            await env.restart(0)
            continue
        await env.run_until_idle()
        if env.crashed:
            continue
        run = await env.get_run(run_id)
        if run.status.terminal:
            return run
    raise AssertionError(f"run {run_id} did not settle")


async def test_a_failure_undoes_the_completed_steps_in_reverse(store: Any) -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        agency.store = env.store
        await env.start("trip", "status", "r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        assert run.error is not None and run.error["cause_message"] == "no car left"
        assert "compensation" not in run.error["message"]
        assert agency.log == ["hotel-1", "flight-1"]
        # the run is ``cancelling`` while it undoes (committed before the first undo)
        assert agency.statuses == [RunStatus.CANCELLING, RunStatus.CANCELLING]
        h = await env.history("r")
        assert _undos(h) == [
            ("compensation_completed", "c1", "2"),
            ("compensation_completed", "c2", "1"),
        ]
        assert h.types[-1] == "run_failed"
        assert [e.result for e in h if isinstance(e, CompensationCompleted)] == [
            "cancelled hotel-1",
            "cancelled flight-1",
        ]
        with pytest.raises(flowkit.WorkflowFailedError):
            await env.engines[0].result("r", timeout=5)
        await flowkit.replay_async(h, Trip(Agency()))  # the compensated history replays


async def test_a_failing_undo_is_retried_by_its_steps_policy_durably(store: Any) -> None:
    agency = Agency(undo_fails={"hotel": 1})
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        await env.advance(3600)  # the car fails, the hotel's undo fails once
        run = await env.get_run("r")
        h = await env.history("r")
        failed = [e for e in h if isinstance(e, CompensationFailed)]
        assert len(failed) == 1 and failed[0].retry_at is not None
        # waiting for the retry: still cancelling, its lease given back, due at the retry
        assert run.status is RunStatus.CANCELLING and run.lease_owner is None
        assert run.wake_at == failed[0].retry_at
        assert agency.calls["cancel flight-1"] == 0  # (the flight's undo comes after)
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        h = await env.history("r")
        assert _undos(h) == [
            ("compensation_failed", "c1", "2"),
            ("compensation_completed", "c1", "2"),
            ("compensation_completed", "c2", "1"),
        ]
        assert agency.calls["cancel hotel-1"] == 2 and agency.calls["cancel flight-1"] == 1
        done = next(e for e in h if isinstance(e, CompensationCompleted))
        assert done.attempt == 2 and done.at >= failed[0].retry_at
        await flowkit.replay_async(h, Trip(Agency()))


async def test_an_undo_that_fails_for_good_leaves_the_rest_running(store: Any) -> None:
    agency = Agency(undo_fails={"hotel": None})
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        # the body's error, with a note naming the undo that failed
        assert run.error is not None and run.error["type"] == "StepFailedError"
        assert run.error["cause_message"] == "no car left"
        assert (
            "compensation 'Agency.cancel' of the step at position 2 failed after 3"
            in (run.error["message"])
        )
        assert agency.calls["cancel hotel-1"] == 3  # its step's policy: 3 attempts
        assert agency.calls["cancel flight-1"] == 1  # the flight is still undone
        h = await env.history("r")
        assert [t for t, _, _ in _undos(h)] == [
            "compensation_failed",
            "compensation_failed",
            "compensation_failed",
            "compensation_completed",
        ]
        assert [e.retry_at is None for e in h if isinstance(e, CompensationFailed)] == [
            False,
            False,
            True,
        ]
        await flowkit.replay_async(h, Trip(Agency()))


async def test_cancel_with_compensate_undoes_and_settles_cancelled(store: Any) -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        await env.advance(60)
        run = await env.cancel("r", compensate=True)
        run = await _settle(env, "r")
        assert run.status is RunStatus.CANCELLED
        assert agency.log == ["hotel-1", "flight-1"]
        assert agency.calls["book car"] == 0
        h = await env.history("r")
        req = [e for e in h if e.type == "cancel_requested"]
        assert len(req) == 1 and req[0].compensate is True
        assert [e.step_pos for e in h if isinstance(e, CompensationCompleted)] == ["2", "1"]
        assert h.types[-1] == "run_cancelled"
        with pytest.raises(flowkit.RunCancelledError):
            await env.engines[0].result("r", timeout=5)
        await flowkit.replay_async(h, Trip(Agency()))


async def test_a_plain_cancel_does_not_compensate(store: Any) -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        await env.advance(60)
        await env.cancel("r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.CANCELLED
        assert agency.log == []
        assert _undos(await env.history("r")) == []


async def test_a_cancel_delivered_to_a_running_activation_reads_its_compensate() -> None:
    """The request reaches the activation while its step runs (not from its history)."""
    gate = asyncio.Event()

    @workflow(name="held")
    class Held:
        def __init__(self) -> None:
            self.undone: list[str] = []

        def book(self) -> str:
            return "b-1"

        def undo(self, b: str) -> None:
            self.undone.append(b)

        async def wait(self) -> str:
            await gate.wait()
            return "never"

        async def run(self, ctx: WorkflowCtx, _: None) -> str:
            await ctx.step(self.book, compensate=self.undo)
            return await ctx.step(self.wait)

    wf = Held()
    async with TestEnv([wf], hung_step_after=0) as env:  # (its step hangs on purpose)
        await env.start("held", None, "h")
        await env.run_until_idle()
        assert (await env.get_run("h")).lease_owner is not None  # in its step
        await env.cancel("h", compensate=True)
        run = await _settle(env, "h")
        assert run.status is RunStatus.CANCELLED and wf.undone == ["b-1"]


@pytest.mark.parametrize("point", ["before_compensation_record", "after_compensation_record"])
async def test_a_crash_around_an_undos_record_never_runs_it_twice_nor_skips_one(
    store: Any, point: str
) -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        env.crash_at(0, point)
        await env.start("trip", "seq", "r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        # before its record: the hotel's undo ran, was lost, and runs again once; after: it
        # is recorded and never runs again
        expected = 2 if point == "before_compensation_record" else 1
        assert agency.calls["cancel hotel-1"] == expected
        assert agency.calls["cancel flight-1"] == 1
        assert agency.calls["book flight"] == 1 and agency.calls["book car"] == 1
        h = await env.history("r")
        assert _undos(h) == [
            ("compensation_completed", "c1", "2"),
            ("compensation_completed", "c2", "1"),
        ]
        await flowkit.replay_async(h, Trip(Agency()))


async def test_a_crash_while_waiting_to_retry_an_undo_resumes_it(store: Any) -> None:
    agency = Agency(undo_fails={"flight": 1})
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        await env.advance(3600)
        await env.crash(0)
        await env.restart(0)
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        assert agency.calls["cancel hotel-1"] == 1 and agency.calls["cancel flight-1"] == 2


async def test_only_completed_steps_are_undone_after_nested_failures(store: Any) -> None:
    """A caught failure (the car) has nothing to undo; the later failure undoes the taxi,
    the hotel and the flight."""
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "caught", "r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        assert run.error is not None and run.error["type"] == "RuntimeError"
        assert agency.log == ["taxi-1", "hotel-1", "flight-1"]
        await flowkit.replay_async(await env.history("r"), Trip(Agency()))


async def test_steps_of_a_gather_are_undone_in_reverse_order_of_their_records(
    store: Any,
) -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "gather", "r")
        run = await _settle(env, "r")
        assert run.status is RunStatus.FAILED
        h = await env.history("r")
        done = {e.pos: e.seq for e in h if e.type == "step_completed"}
        # the reverse of the completions' order in the history
        order = sorted(done, key=lambda p: done[p], reverse=True)
        assert [e.step_pos for e in h if isinstance(e, CompensationCompleted)] == order
        assert sorted(agency.log) == ["flight-1", "hotel-1"]
        await flowkit.replay_async(h, Trip(Agency()))


async def test_a_completed_run_runs_no_undo(store: Any) -> None:
    agency = Agency(fail="nothing")
    async with TestEnv([Trip(agency)], store=store) as env:
        await env.start("trip", "seq", "r")
        assert await env.result("r") == ["flight-1", "hotel-1", "car-1"]
        assert agency.log == [] and _undos(await env.history("r")) == []


async def test_a_singleton_holder_keeps_its_slot_until_its_last_undo(store: Any) -> None:
    @workflow(name="lane", singleton=Singleton(key=lambda i: "k"))
    class Lane:
        def __init__(self) -> None:
            self.undo_calls = 0
            self.started: list[str] = []

        def take(self, who: str) -> str:
            self.started.append(who)
            return who

        def give_back(self, who: str) -> None:
            self.undo_calls += 1
            if self.undo_calls == 1:
                raise ConnectionError("busy")

        async def run(self, ctx: WorkflowCtx, who: str) -> None:
            await ctx.step(self.take, who, compensate=self.give_back, retry=RETRY)
            if who == "first":
                raise RuntimeError("boom")

    wf = Lane()
    async with TestEnv([wf], store=store) as env:
        await env.start("lane", "first", "a")
        await env.start("lane", "second", "b")
        # the first's undo waits for its retry: it holds the key, the second waits
        assert (await env.get_run("a")).status is RunStatus.CANCELLING
        assert wf.started == ["first"]
        waiter = await env.get_run("b")
        assert waiter.status.active and not waiter.admitted  # (parked at the gate)
        await env.advance(5)
        assert (await env.get_run("a")).status is RunStatus.FAILED
        assert await env.result("b") is None
        assert wf.started == ["first", "second"] and wf.undo_calls == 2
        h = await env.history("a")
        last_undo = max(e.seq for e in h if isinstance(e, CompensationCompleted))
        released = [e.seq for e in h if e.type == "singleton_released"]
        assert released and released[0] > last_undo


async def test_a_changed_compensation_diverges_on_replay() -> None:
    agency = Agency()
    async with TestEnv([Trip(agency)]) as env:
        await env.start("trip", "seq", "r")
        await _settle(env, "r")
        h = await env.history("r")

    @workflow(name="trip")
    class NoUndo:
        def __init__(self, a: Agency) -> None:
            self.a = a

        async def run(self, ctx: WorkflowCtx, mode: str) -> list[str]:
            await ctx.step(self.a.book, "flight", retry=RETRY)
            await ctx.step(self.a.book, "hotel", retry=RETRY)
            await ctx.sleep(3600)
            await ctx.step(self.a.book, "car")
            return []

    with pytest.raises(flowkit.NonDeterminismError) as err:
        await flowkit.replay_async(h, NoUndo(Agency()))
    assert err.value.position == "c1"

    @workflow(name="trip")
    class OtherUndo(NoUndo):
        def refund(self, booking: str) -> None:
            pass

        async def run(self, ctx: WorkflowCtx, mode: str) -> list[str]:
            await ctx.step(self.a.book, "flight", retry=RETRY, compensate=self.refund)
            await ctx.step(self.a.book, "hotel", retry=RETRY, compensate=self.refund)
            await ctx.sleep(3600)
            await ctx.step(self.a.book, "car")
            return []

    with pytest.raises(flowkit.NonDeterminismError) as err:
        await flowkit.replay_async(h, OtherUndo(Agency()))
    assert err.value.position == "c1" and "OtherUndo.refund') of step at position 2" in str(
        err.value
    )


async def test_bad_compensate_arguments_are_refused() -> None:
    @workflow(name="bad")
    class Bad:
        def book(self) -> str:
            return "x"

        async def run(self, ctx: WorkflowCtx, _: None) -> None:
            await ctx.step(self.book, compensate="not callable")  # type: ignore[arg-type]

    async with TestEnv([Bad()]) as env:
        await env.start("bad", None, "b")
        run = await _settle(env, "b")
        assert run.status is RunStatus.FAILED and run.error is not None
        assert run.error["type"] == "TypeError"
        assert (await env.history("b")).types == ["run_started", "run_failed"]
        with pytest.raises(flowkit.InvalidInputError):
            await env.cancel("b", compensate="yes")  # type: ignore[arg-type]


def test_flowkit_history_prints_the_compensations() -> None:
    done = CompensationCompleted(pos="c1", step_pos="2", name="cancel", attempt=2, result="ok")
    assert _describe(done, 0.0) == 'cancel undoes step 2 attempt 2 -> "ok"'
    failed = CompensationFailed(
        pos="c1",
        step_pos="2",
        name="cancel",
        error=flowkit.events.ErrorInfo(type="ConnectionError", message="busy"),
        retry_at=5.0,
    )
    assert _describe(failed, 0.0) == (
        "cancel undoes step 2 attempt 1 ConnectionError: busy; retry at +5.000s"
    )
