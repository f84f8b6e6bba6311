"""A worker lives through store failures (docs/stores.md, "When the store fails"): a
transient failure is retried by the lease holder within a second or two of virtual time, from
a fresh read, never re-running a committed step nor recording one twice; a stall longer than
the lease makes it drop the run instead of running steps beside the new owner; one stalled
renewal holds up no other; a write that keeps failing the same way ends the run.

Every test runs on MemoryStore, SqlStore on a SQLite file and on PostgreSQL (the ``store``
fixture), wrapped in ``FaultyStore``; time is ``TestEnv``'s virtual clock."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from flowkit import RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.errors import CodecError, SerializationError
from flowkit.stores.base import Update
from flowkit_testing import TestEnv

try:
    from faulty_store import FaultyStore, by_owner, of_run, records_step
except ImportError:  # pragma: no cover - run from the repository root
    from tests.faulty_store import FaultyStore, by_owner, of_run, records_step

RECORDS = ("append_events", "commit")  # how a worker records a step (per store)


@workflow(name="recover-steps")
class Steps:
    """``n`` steps; counts every execution, and each step may wait for a test's event."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, int]] = Counter()
        self.hold: dict[tuple[str, int], asyncio.Event] = {}

    async def work(self, run_id: str, i: int) -> str:
        self.calls[(run_id, i)] += 1
        ev = self.hold.get((run_id, i))
        if ev is not None:
            await ev.wait()
        return f"r{i}"

    async def run(self, ctx: WorkflowCtx, n: int) -> list[str]:
        return [await ctx.step(self.work, ctx.run_id, i, name=f"s{i}") for i in range(n)]


@workflow(name="recover-solo", singleton=Singleton(key=lambda k: k))
class Solo:
    """A singleton run of two steps; the key is the input."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    async def work(self, run_id: str) -> str:
        self.calls[run_id] += 1
        return run_id

    async def run(self, ctx: WorkflowCtx, key: str) -> str:
        await ctx.step(self.work, ctx.run_id, name="one")
        return await ctx.step(self.work, ctx.run_id, name="two")


@workflow(name="recover-nap")
class Nap:
    """A step, a timer, a step."""

    async def run(self, ctx: WorkflowCtx, n: int) -> str:
        await ctx.step(lambda: "a", name="a")
        await ctx.sleep(5)
        await ctx.step(lambda: "b", name="b")
        return "done"


@workflow(name="recover-big")
class Big:
    """One step, then an output the (faulty) store refuses."""

    async def run(self, ctx: WorkflowCtx, n: int) -> str:
        await ctx.step(lambda: "a", name="a")
        return "too big"


async def _step_types(env: TestEnv, run_id: str) -> list[tuple[str, str]]:
    return [(e.type, getattr(e, "name", "")) for e in await env.history(run_id)]


async def _recorded_once(env: TestEnv, run_id: str, n: int) -> None:
    done = [e.name for e in await env.history(run_id) if e.type == "step_completed"]
    assert sorted(done) == sorted(f"s{i}" for i in range(n))  # each step recorded once


# -- (a), (b): transient failures mid-run ------------------------------------------------------
async def test_transient_failures_mid_run_are_retried_in_seconds(store: Any) -> None:
    """Three failed records in a row (nothing written): the run completes about a second of
    virtual time later, not a lease later; only the step whose record never landed runs again
    (once per failure), and no step is recorded twice."""
    wf = Steps()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty) as env:
        faulty.fail(*RECORDS, times=3, match=records_step("s1"))
        t0 = env.clock.now()
        await env.start("recover-steps", 4, "r")
        await env.run_until_idle()
        run = await env.get_run("r")
        assert run.status is RunStatus.COMPLETED, run
        assert env.clock.now() - t0 < 2.0  # backoff 50+100+200 ms (jittered), not 30 s
        await _recorded_once(env, "r", 4)
    assert len(faulty.failed) == 3
    # s1's record was written with s2 starting (deferred records flush before the next step):
    # s1 ran again after each failure, every other step once
    assert wf.calls == {("r", 0): 1, ("r", 1): 4, ("r", 2): 1, ("r", 3): 1}


async def test_an_ambiguous_commit_that_landed_is_not_rerun(store: Any) -> None:
    """The record landed but the worker saw an error: the retry replays it from a fresh read;
    no step runs twice, none is recorded twice."""
    wf = Steps()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty) as env:
        faulty.fail(*RECORDS, times=2, phase="after", match=records_step("s1"))
        t0 = env.clock.now()
        await env.start("recover-steps", 4, "r")
        await env.run_until_idle()
        assert (await env.get_run("r")).status is RunStatus.COMPLETED
        assert env.clock.now() - t0 < 2.0
        await _recorded_once(env, "r", 4)
    assert faulty.failed and all(f[1] == "after" for f in faulty.failed)
    assert wf.calls == {("r", i): 1 for i in range(4)}


async def test_a_failed_claim_and_reads_are_retried(store: Any) -> None:
    """A woken run whose claim lands but is answered with an error, then whose reads fail:
    the worker finds its own lease on the fresh read and resumes."""
    faulty = FaultyStore(store)
    async with TestEnv([Nap()], store=faulty) as env:
        await env.start("recover-nap", 0, "n")
        assert (await env.get_run("n")).status is RunStatus.SUSPENDED
        faulty.fail("claim", phase="after")
        faulty.fail("get_run", "load_events", times=2, match=of_run("n"))
        t0 = env.clock.now()
        await env.run_until_idle()
        assert (await env.get_run("n")).status is RunStatus.COMPLETED
        assert env.clock.now() - t0 < 5 + 2.0
        assert [t for t, _ in await _step_types(env, "n")].count("step_completed") == 2
    assert [f[0] for f in faulty.failed][:1] == ["claim"]


# -- (c): a singleton holder's release ---------------------------------------------------------
@pytest.mark.parametrize("phase", ["before", "after"])
async def test_a_failed_release_still_hands_the_key_over_promptly(store: Any, phase: str) -> None:
    """The holder's settling commit (which releases its slot and hands it to the waiter)
    fails once, before or after it landed: the waiter still runs within a second or two,
    each run's steps once, and the key never has two holders."""
    wf = Solo()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty) as env:

        def settles_h(args: tuple[Any, ...]) -> bool:
            upd = args[3] if len(args) > 3 else None
            return args[0] == "h" and isinstance(upd, Update) and upd.notify is not None

        faulty.fail("commit", phase=phase, match=settles_h)  # type: ignore[arg-type]
        # (both started before any activation: w waits at the gate behind h)
        t0 = env.clock.now()
        await env.start("recover-solo", "k", "h")
        await env.start("recover-solo", "k", "w")
        await env.run_until_idle()
        h, w = await env.get_run("h"), await env.get_run("w")
        assert h.status is RunStatus.COMPLETED and w.status is RunStatus.COMPLETED, (h, w)
        assert env.clock.now() - t0 < 2.0 + 1.25  # (the waiter's own gate re-check: 1 s)
        hist_h = [e.type for e in await env.history("h")]
        hist_w = [e.type for e in await env.history("w")]
        assert hist_h.count("singleton_released") == 1 and hist_h[-1] == "run_completed"
        assert hist_w.count("singleton_admitted") == 1
        released = next(e.at for e in await env.history("h") if e.type == "singleton_released")
        admitted = next(e.at for e in await env.history("w") if e.type == "singleton_admitted")
        assert admitted >= released  # never two holders
    assert len(faulty.failed) == 1
    # h's second step was recorded with its settling commit: when that did not land, the step
    # was not committed and runs again; when it did, it is replayed
    assert wf.calls == {"h": 3 if phase == "before" else 2, "w": 2}


# -- (d): a stall longer than the lease --------------------------------------------------------
async def test_a_worker_stalled_past_its_lease_runs_no_step_beside_the_new_owner(
    store: Any,
) -> None:
    """Instance 0 records step s0, but the store's answer takes 35 s (its renewals stall too):
    by then instance 1 has claimed the run and runs s1. Instance 0, answered at last, cannot
    prove its lease any more: it drops the run instead of starting s1 too."""
    wf = Steps()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty, instances=2) as env:
        wf.hold[("r", 1)] = go = asyncio.Event()
        answer = faulty.stall(*RECORDS, phase="after", match=records_step("s0", "r"))
        renewals = faulty.stall("renew_lease", match=by_owner("instance-0"))
        await env.engines[0].start("recover-steps", 2, "r")
        await env.settle()
        assert answer.stalled == 1  # instance 0 waits for the answer to s0's record
        assert wf.calls == {("r", 0): 1}
        await env.advance(35)  # past the lease (30 s): instance 1 claims the run
        run = await env.get_run("r")
        assert run.lease_owner == "instance-1", run
        assert wf.calls[("r", 1)] == 1  # instance 1 replayed s0 and started s1
        answer.release()
        await env.settle()
        assert not env.engines[0].executing("r")  # dropped, not run beside instance 1
        assert wf.calls[("r", 1)] == 1
        renewals.release()
        go.set()
        await env.run_until_idle()
        assert (await env.get_run("r")).status is RunStatus.COMPLETED
        await _recorded_once(env, "r", 2)
    assert wf.calls == {("r", 0): 1, ("r", 1): 1}


# -- (f): one stalled renewal ------------------------------------------------------------------
async def test_one_stalled_renewal_holds_up_no_other(store: Any) -> None:
    """Run a's renewals stall; run b's lease keeps being renewed all along (a's own lease
    lapses, and its worker drops it: no step result is recorded without a provable lease)."""
    wf = Steps()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty, hung_step_after=0) as env:  # (a hung step)
        wf.hold[("a", 0)] = go_a = asyncio.Event()
        wf.hold[("b", 0)] = go_b = asyncio.Event()
        stalled = faulty.stall("renew_lease", match=of_run("a"))
        await env.start("recover-steps", 1, "a")
        await env.start("recover-steps", 1, "b")
        for _ in range(20):  # 100 s: b's lease is renewed every 10 s
            await env.advance(5)
            b = await env.get_run("b")
            assert b.lease_owner == "instance-0"
            assert b.lease_expires is not None and b.lease_expires > env.clock.now()
        assert stalled.fired >= 5  # a's renewals were tried, and each stalled
        go_b.set()
        await env.settle()
        assert (await env.get_run("b")).status is RunStatus.COMPLETED
        go_a.set()  # a's step ends long after its lease lapsed: not recorded by this activation
        await env.settle()
        assert [e.type for e in await env.history("a")].count("step_completed") == 0
        stalled.release()
        await env.run_until_idle()  # recovery: a's lease expires, the run runs again
        assert (await env.get_run("a")).status is RunStatus.COMPLETED
    assert wf.calls[("b", 0)] == 1
    assert wf.calls[("a", 0)] == 2  # its first result was never recorded


# -- (e): deterministic failures ---------------------------------------------------------------
async def test_a_record_the_store_keeps_refusing_fails_the_run(store: Any) -> None:
    """A step record that fails with ``SerializationError`` every time: after three tries
    the run is ``failed`` with that error, naming what failed; it does not loop."""
    wf = Steps()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty) as env:
        faulty.fail(
            *RECORDS,
            times=None,
            match=records_step("s0"),
            error=lambda: SerializationError("value too large for the store"),
        )
        await env.start("recover-steps", 2, "r")
        await env.run_until_idle()
        run = await env.get_run("r")
        assert run.status is RunStatus.FAILED, run
        assert run.error is not None and run.error["type"] == "SerializationError"
        assert "failed 3 times in a row" in run.error["message"]
        assert "recording the run's events" in run.error["message"]
        assert "value too large" in run.error["message"]
        assert [e.type for e in await env.history("r")][-1] == "run_failed"
        await env.run_until_idle()
    assert len(faulty.failed) == 3
    assert wf.calls[("r", 0)] == 3 and ("r", 1) not in wf.calls


async def test_an_output_the_store_refuses_fails_the_run_with_that_error(store: Any) -> None:
    """The run's own terminal commit fails deterministically: the run ends ``failed`` with the
    ``SerializationError`` instead of its output."""
    faulty = FaultyStore(store)
    async with TestEnv([Big()], store=faulty) as env:

        def completes(args: tuple[Any, ...]) -> bool:
            upd = args[3] if len(args) > 3 else None
            return isinstance(upd, Update) and upd.status is RunStatus.COMPLETED

        faulty.fail(
            "commit",
            times=None,
            match=completes,
            error=lambda: SerializationError("output cannot be stored"),
        )
        await env.start("recover-big", 0, "r")
        await env.run_until_idle()
        run = await env.get_run("r")
        assert run.status is RunStatus.FAILED, run
        assert run.error is not None and run.error["type"] == "SerializationError"
        assert "commit of the completed outcome" in run.error["message"]
        assert run.output is None
        types = [e.type for e in await env.history("r")]
        assert types.count("step_completed") == 1 and types[-1] == "run_failed"


async def test_an_undecodable_history_blocks_the_run(store: Any) -> None:
    """The history cannot be decoded (a tampered value, a missing key): after
    ``max_store_failures`` tries (2 here) the run is ``blocked`` with the ``CodecError`` (an
    operator can fix the key; it retries after ``blocked_retry``), not ``running`` forever."""
    faulty = FaultyStore(store)
    async with TestEnv([Nap()], store=faulty) as env:
        env.engines[0].max_store_failures = 2
        await env.start("recover-nap", 0, "n")
        faulty.fail(
            "load_events",
            times=None,
            match=of_run("n"),
            error=lambda: CodecError("envelope failed authentication", key_id="k1"),
        )
        await env.advance(6)
        run = await env.get_run("n")
        assert run.status is RunStatus.BLOCKED, run
        assert run.error is not None and run.error["type"] == "CodecError"
        assert "load_events failed 2 times in a row" in run.error["message"]
        assert run.lease_owner is None
        calls = len(faulty.failed)
        assert calls == 2
        await env.advance(10)  # blocked: nothing retries before blocked_retry
        assert len(faulty.failed) == calls


async def test_a_missing_key_leaves_the_run_for_a_worker_that_has_it(store: Any) -> None:
    """A ``CodecError`` that is this process's fault (``missing_key``: a key id it does not
    have) does not end a healthy run: the worker leaves it, and it is neither blocked nor
    failed; its lease expires and a worker with the key takes it."""
    faulty = FaultyStore(store)
    async with TestEnv([Nap()], store=faulty) as env:
        env.engines[0].max_store_failures = 2
        await env.start("recover-nap", 0, "n")
        faulty.fail(
            "load_events",
            times=3,
            match=of_run("n"),
            error=lambda: CodecError("no key 'k9'", key_id="k9", missing_key=True),
        )
        await env.advance(6)
        run = await env.get_run("n")
        assert run.status not in (RunStatus.BLOCKED, RunStatus.FAILED), run
        assert len(faulty.failed) == 1  # left at the first: no tries counted toward giving up
        await env.run_until_idle()  # the lease expires, the key is "deployed": it completes
        assert (await env.get_run("n")).status is RunStatus.COMPLETED


@workflow(name="recover-long")
class LongStep:
    """Three steps; the second waits for ``gate`` (a step that runs a long time)."""

    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()
        self.gate = asyncio.Event()

    async def work(self, i: int) -> int:
        self.calls[i] += 1
        if i == 1:
            await self.gate.wait()
        return i

    async def run(self, ctx: WorkflowCtx, n: int) -> list[int]:
        return [await ctx.step(self.work, i, name=f"s{i}") for i in range(n)]


async def test_a_blip_long_after_an_earlier_one_is_retried_too(store: Any) -> None:
    """The time bound on transient retries counts from the latest progress, not from the
    activation's first failure: a blip early on and another a minute later (after a long step)
    are both retried at once; the run does not wait out its lease."""
    wf = LongStep()
    faulty = FaultyStore(store)
    async with TestEnv([wf], store=faulty, hung_step_after=0) as env:  # (a hung step)
        faulty.fail(*RECORDS, times=1, match=records_step("s0"))
        t0 = env.clock.now()
        await env.start("recover-long", 3, "r")
        await env.settle()
        await env.advance(1)  # s0 retried; s1 running
        await env.advance(60)  # a long step (renewals keep the lease)
        faulty.fail(*RECORDS, times=1, match=records_step("s1"))
        wf.gate.set()
        await env.settle()
        await env.advance(2)
        run = await env.get_run("r")
        assert run.status is RunStatus.COMPLETED, run
        assert env.clock.now() - t0 < 64
        types = [e.type for e in await env.history("r")]
        assert types.count("step_completed") == 3
