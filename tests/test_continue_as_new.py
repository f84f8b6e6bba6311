"""Continue-as-new (docs/composing-workflows.md): ``ctx.continue_as_new`` settles the run and
starts its successor ``base~n`` in one transaction, with a fresh history; ``engine.result`` follows
the chain; a singleton holder passes its slot on; a pending cancel wins; crashes around the
continuation's commit leave exactly one successor. On MemoryStore, a SQLite file and
PostgreSQL (the ``store`` fixture), in ``TestEnv``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from pydantic import BaseModel
from sim_kit import start_on_a_live_instance

from flowkit import (
    NonDeterminismError,
    RunStatus,
    Singleton,
    WorkflowCtx,
    WorkflowFailedError,
    replay,
    workflow,
)
from flowkit._worker.continue_as_new import base_id, successor_id
from flowkit.events import RunContinued
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore
from flowkit_testing import FaultPlan, Rule, TestEnv
from flowkit_testing._faults import _continues


class Count(BaseModel):
    n: int = 0
    until: int = 3


@workflow(name="counter", execution_timeout=600)
class Counter:
    """Three steps, then continue as new with ``n + 1`` until ``until``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def tick(self, n: int, i: int) -> int:
        self.calls.append((n, i))
        return i

    async def run(self, ctx: WorkflowCtx, input: Count) -> int:
        for i in range(3):
            await ctx.step(self.tick, input.n, i)
        if input.n < input.until:
            ctx.continue_as_new(Count(n=input.n + 1, until=input.until))
        return input.n * 10


def test_successor_ids_count_from_the_base() -> None:
    assert successor_id("order-1") == "order-1~1"
    assert successor_id("order-1~1") == "order-1~2"
    assert successor_id("order-1~9") == "order-1~10"
    assert successor_id("a~b") == "a~b~1"  # (not a number: part of the base)
    assert base_id("order-1~12") == "order-1" and base_id("order-1") == "order-1"


async def test_a_chain_of_runs_with_fresh_histories(store: Any) -> None:
    wf = Counter()
    async with TestEnv([wf], store=store) as env:
        await env.start("counter", {"n": 0, "until": 3}, "c", tags=["team:a"])
        assert await env.result("c") == 30  # followed to the chain's last run
        assert await env.engines[0].result("c~1", timeout=5) == 30
        ids = ["c", "c~1", "c~2", "c~3"]
        for i, rid in enumerate(ids):
            run = await env.get_run(rid)  # get_run: the run asked for
            assert run.status is RunStatus.COMPLETED
            assert run.input == {"n": i, "until": 3}
            assert run.continued_as == (ids[i + 1] if i < 3 else None)
            assert run.tags == ("team:a",)
            assert run.workflow_version == "1"
            assert run.deadline_at == pytest.approx(run.created_at + 600)  # a fresh deadline
            events = (await env.history(rid)).events
            assert events[0].type == "run_started" and events[0].seq == 1
            assert [e.type for e in events[1:4]] == ["step_completed"] * 3
            if i < 3:
                assert [e.type for e in events[4:]] == ["run_continued", "run_completed"]
                cont = events[4]
                assert isinstance(cont, RunContinued)
                assert cont.next_run_id == ids[i + 1]
                assert cont.input == {"n": i + 1, "until": 3}
                assert run.output is None
            else:
                assert [e.type for e in events[4:]] == ["run_completed"]
        assert sorted(r.id for r in await env.store.list_runs(workflow="counter")) == ids
        assert wf.calls == [(n, i) for n in range(4) for i in range(3)]  # each step once


async def test_the_successor_runs_at_once_on_the_committing_worker() -> None:
    """A loop costs no poll: the successor is leased to the worker that committed the
    continuation and executed right away (no virtual time passes, one instance of three)."""
    wf = Counter()
    async with TestEnv([wf], instances=3) as env:
        await env.engines[1].start("counter", {"n": 0, "until": 2}, "c")
        await env.run_until_idle()
        runs = [await env.get_run(r) for r in ("c", "c~1", "c~2")]
        assert all(r.status is RunStatus.COMPLETED for r in runs)
        assert len({r.updated_at for r in runs}) == 1  # the virtual clock never moved
        assert (await env.history("c~1")).events[0].type == "run_started"


@workflow(name="forever")
class Forever:
    """Loops forever (until ``stop``, a bound for the test only), continuing as new every
    1,000 steps: each run's history stays bounded."""

    def __init__(self) -> None:
        self.steps = 0

    async def tick(self, i: int) -> int:
        self.steps += 1
        return i + 1

    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        i = input["i"]
        while i < input["stop"]:
            i = await ctx.step(self.tick, i)
            if i % 1000 == 0:
                ctx.continue_as_new({"i": i, "stop": input["stop"]})
        return i


async def test_a_forever_loop_keeps_each_history_bounded() -> None:
    wf = Forever()
    async with TestEnv([wf]) as env:
        await env.start("forever", {"i": 0, "stop": 10_001}, "loop")
        assert await env.result("loop") == 10_001
        assert wf.steps == 10_001  # 10,000 iterations in 10 runs, and one more
        for k in range(11):
            rid = "loop" if k == 0 else f"loop~{k}"
            events = (await env.history(rid)).events
            # run_started, at most 1,000 steps, run_continued, run_completed
            assert len(events) <= 1003, (rid, len(events))
        assert (await env.get_run("loop~9")).continued_as == "loop~10"
        assert (await env.get_run("loop~10")).continued_as is None


class Keyed(BaseModel):
    key: str
    n: int = 0
    until: int = 1


@workflow(name="keyed-loop", singleton=Singleton(key=lambda i: i.key))
class KeyedLoop:
    """A singleton holder that waits for ``go`` and continues as new until ``until``."""

    async def run(self, ctx: WorkflowCtx, input: Keyed) -> int:
        await ctx.wait_for_signal("go")
        if input.n < input.until:
            ctx.continue_as_new(Keyed(key=input.key, n=input.n + 1, until=input.until))
        return input.n


async def test_a_singleton_holder_passes_its_slot_to_its_successor(store: Any) -> None:
    async with TestEnv([KeyedLoop()], store=store) as env:
        await env.start("keyed-loop", {"key": "k", "until": 1}, "h")
        await env.run_until_idle()
        await env.start("keyed-loop", {"key": "k", "until": 0}, "w")  # queues meanwhile
        await env.run_until_idle()
        assert (await env.get_run("w")).admitted is False
        await env.signal("h", "go")
        await env.run_until_idle()
        h, h1, w = [await env.get_run(r) for r in ("h", "h~1", "w")]
        assert h.status is RunStatus.COMPLETED and h.continued_as == "h~1"
        assert h1.admitted and h1.status.active  # the slot went to the successor
        assert not w.admitted and w.status is RunStatus.SUSPENDED  # still waiting
        h_types = [e.type for e in (await env.history("h")).events]
        assert h_types[-3:] == ["singleton_released", "run_continued", "run_completed"]
        h1_types = [e.type for e in (await env.history("h~1")).events]
        assert h1_types[:2] == ["run_started", "singleton_admitted"]
        assert "singleton_admitted" not in [e.type for e in (await env.history("w")).events]
        # the chain ends: then the waiter gets the slot
        await env.signal("h~1", "go")
        await env.run_until_idle()
        assert (await env.get_run("h~1")).status is RunStatus.COMPLETED
        assert (await env.get_run("w")).admitted
        await env.signal("w", "go")
        assert await env.result("h") == 1
        assert await env.result("w") == 0


@workflow(name="stubborn")
class Stubborn:
    """Continues as new when its wait is cancelled: the pending cancel must win."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        try:
            await ctx.wait_for_signal("go")
        except asyncio.CancelledError:
            ctx.continue_as_new(n + 1)
        if n < 1:
            ctx.continue_as_new(n + 1)
        return n


async def test_a_pending_cancel_wins_over_the_continuation(store: Any) -> None:
    async with TestEnv([Stubborn()], store=store) as env:
        await env.start("stubborn", 0, "s")
        await env.run_until_idle()
        await env.cancel("s")
        await env.run_until_idle()
        run = await env.get_run("s")
        assert run.status is RunStatus.CANCELLED and run.continued_as is None
        assert await env.store.get_run("s~1") is None
        types = [e.type for e in (await env.history("s")).events]
        assert "run_continued" not in types and types[-1] == "run_cancelled"


@pytest.mark.parametrize("point", ["before_continuation", "after_continuation"])
async def test_a_crash_around_the_continuation_leaves_exactly_one_successor(
    store: Any, point: str
) -> None:
    wf = Counter()
    async with TestEnv([wf], store=store, instances=2) as env:
        env.crash_at(0, point)
        await env.engines[0].start("counter", {"n": 0, "until": 1}, "c")
        await env.run_until_idle()
        assert env.crashed == [0]
        await env.advance(31)  # the dead instance's lease expires: instance 1 recovers
        await env.run_until_idle()
        assert await env.engines[1].result("c", timeout=5) == 10
        ids = sorted(r.id for r in await env.store.list_runs(workflow="counter"))
        assert ids == ["c", "c~1"]  # never two successors, never none
        for rid in ids:
            types = [e.type for e in (await env.history(rid)).events]
            assert types.count("run_started") == 1 and types.count("run_completed") == 1
            assert types.count("run_continued") == (1 if rid == "c" else 0)
        if point == "after_continuation":
            # committed before the crash: the first run's steps ran once, the successor's
            # (leased to the dead instance) after its lease expired
            assert wf.calls.count((0, 0)) == 1
            assert (await env.get_run("c~1")).recoveries == 1


@workflow(name="swallower")
class Swallower:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        with contextlib.suppress(BaseException):  # (what a body must not do)
            ctx.continue_as_new(n + 1)
        return n


@workflow(name="bad-next")
class BadNext:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        ctx.continue_as_new("not a number")


async def test_a_continuation_that_cannot_happen_fails_the_run() -> None:
    async with TestEnv([Swallower(), BadNext(), Counter()]) as env:
        await env.start("swallower", 0, "sw")
        with pytest.raises(WorkflowFailedError, match="must end the body") as caught:
            await env.result("sw")
        assert caught.value.error["type"] == "ContinueAsNewError"
        await env.start("bad-next", 0, "b")
        with pytest.raises(WorkflowFailedError, match="continue_as_new") as caught:
            await env.result("b")
        assert caught.value.error["type"] == "InvalidInputError"
        # the successor's id belongs to another run: the run fails, the other is untouched
        await env.start("counter", {"n": 5, "until": 5}, "t~1")
        assert await env.result("t~1") == 50
        await env.start("counter", {"n": 0, "until": 1}, "t")
        with pytest.raises(WorkflowFailedError, match="is taken"):
            await env.result("t")
        assert (await env.get_run("t~1")).input == {"n": 5, "until": 5}
        for rid in ("sw", "b", "t"):
            assert await env.store.get_run(successor_id(rid)) is None or rid == "t"


class NoContinuation(MemoryStore):
    continues_as_new = False


async def test_a_store_without_the_capability_fails_the_run_clearly() -> None:
    async with TestEnv([Counter()], store=NoContinuation()) as env:
        await env.start("counter", {"n": 0, "until": 1}, "c")
        with pytest.raises(WorkflowFailedError, match="continues_as_new") as caught:
            await env.result("c")
        assert caught.value.error["type"] == "UnsupportedStoreError"
        assert await env.store.get_run("c~1") is None


@workflow(name="counter")
class CounterReturns(Counter):
    """``counter``'s next deploy: it no longer continues."""

    async def run(self, ctx: WorkflowCtx, input: Count) -> int:
        for i in range(3):
            await ctx.step(self.tick, input.n, i)
        return input.n * 10


@workflow(name="counter")
class CounterSkips(Counter):
    """``counter`` continuing with another input."""

    async def run(self, ctx: WorkflowCtx, input: Count) -> int:
        for i in range(3):
            await ctx.step(self.tick, input.n, i)
        ctx.continue_as_new(Count(n=input.n + 2, until=input.until))


async def test_replay_checks_the_continuation_like_the_output() -> None:
    async with TestEnv([Counter()]) as env:
        await env.start("counter", {"n": 0, "until": 1}, "c")
        await env.result("c")
        first = (await env.history("c")).to_json()
        last = (await env.history("c~1")).to_json()
    await asyncio.to_thread(replay, first, Counter)
    await asyncio.to_thread(replay, last, Counter)
    with pytest.raises(NonDeterminismError, match="without continue-as-new"):
        await asyncio.to_thread(replay, first, CounterReturns)
    with pytest.raises(NonDeterminismError, match="different input"):
        await asyncio.to_thread(replay, first, CounterSkips)
    with pytest.raises(NonDeterminismError, match="continue_as_new"):
        await asyncio.to_thread(replay, last, CounterSkips)


async def test_result_follows_the_chain_with_a_timeout() -> None:
    async with TestEnv([KeyedLoop()]) as env:
        await env.start("keyed-loop", {"key": "x", "until": 2}, "k")
        await env.run_until_idle()
        await env.signal("k", "go")
        await env.run_until_idle()
        with pytest.raises(TimeoutError, match="k~1"):
            await env.engines[0].result("k", timeout=0.05)
        await env.signal("k~1", "go")
        await env.run_until_idle()
        await env.signal("k~2", "go")
        assert await env.result("k") == 2


async def test_a_seeded_crash_plan_around_continuations_leaves_whole_chains() -> None:
    """The deterministic simulation: three instances, each dying at random at the crash
    points around the continuation's commit; once all are back, every chain is whole (one
    run per link, ``run_continued`` once in each but the last) and ends with its output."""
    wf = Counter()
    plan = FaultPlan(crash_rate=0.4, crash_points=("before_continuation", "after_continuation"))
    async with TestEnv([wf], instances=3, seed=7, faults=plan) as env:
        for i in range(4):
            await start_on_a_live_instance(env, "counter", {"n": 0, "until": 3}, f"r{i}")
        await env.run_until_idle()
        crashes = [f for f in env.fired if f[3] == "crash"]
        assert crashes, "the seed should have crashed some instance"
        env.fault_plan = None
        for j in list(env.crashed):
            await env.restart(j)
        await env.advance(31)
        await env.run_until_idle()
        for i in range(4):
            assert await env.engines[0].result(f"r{i}", timeout=5) == 30
            chain = [f"r{i}", *(f"r{i}~{n}" for n in range(1, 4))]
            ids = sorted(r.id for r in await env.store.list_runs() if r.id.startswith(f"r{i}"))
            assert ids == chain
            for k, rid in enumerate(chain):
                types = [e.type for e in (await env.history(rid)).events]
                assert types.count("run_continued") == (k < 3)
                assert types.count("run_started") == 1 and types[-1] == "run_completed"


@workflow(name="rekey", singleton=Singleton(key=lambda i: i.key))
class Rekey:
    """Continues once under another key: the old key's slot is released as by a settling."""

    async def run(self, ctx: WorkflowCtx, input: Keyed) -> int:
        await ctx.wait_for_signal("go")
        if input.n < input.until:
            ctx.continue_as_new(Keyed(key="other", n=input.n + 1, until=input.until))
        return input.n


async def test_a_continuation_under_another_key_releases_the_old_one(store: Any) -> None:
    async with TestEnv([Rekey()], store=store) as env:
        await env.start("rekey", {"key": "k", "until": 1}, "r")
        await env.start("rekey", {"key": "k", "until": 0}, "w")
        await env.run_until_idle()
        await env.signal("r", "go")
        await env.run_until_idle()
        r1, w = await env.get_run("r~1"), await env.get_run("w")
        assert r1.singleton_key == "other" and r1.admitted  # (a free key: admitted by its gate)
        assert w.admitted  # the old key's slot went to its waiter
        assert "singleton:k" not in r1.tags and "singleton:other" in r1.tags
        await env.signal("r~1", "go")
        await env.signal("w", "go")
        assert await env.result("r") == 1 and await env.result("w") == 0


async def test_a_codec_store_encrypts_the_successor_like_a_new_run() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, AESGCMCodec({"k1": bytes(range(32))}))
    async with TestEnv([Counter()], store=store) as env:
        await env.start("counter", {"n": 0, "until": 1}, "c")
        assert await env.result("c") == 10
        assert (await env.get_run("c~1")).input == {"n": 1, "until": 1}
        cont = next(e for e in (await env.history("c")).events if isinstance(e, RunContinued))
        assert cont.input == {"n": 1, "until": 1}
    raw = await inner.get_run("c~1")
    assert raw is not None and raw.input != {"n": 1, "until": 1}  # stored encrypted
    raw_cont = next(e for e in await inner.load_events("c") if isinstance(e, RunContinued))
    assert raw_cont.input != {"n": 1, "until": 1}
    raw_start = (await inner.load_events("c~1"))[0]
    assert raw_start.type == "run_started" and raw_start.input != {"n": 1, "until": 1}


async def test_a_continuation_that_landed_though_its_call_failed_runs_its_successor() -> None:
    """The commit wrote (run and successor) but its call failed: the fresh read finds the run
    settled, and the successor leased here is resumed at once, not after its lease expires."""
    wf = Counter()
    async with TestEnv([wf]) as env:
        env.inject(Rule("commit", "fault", "after", match=_continues))
        await env.start("counter", {"n": 0, "until": 1}, "c")
        await env.run_until_idle()
        nxt = await env.get_run("c~1")
        assert nxt.status is RunStatus.COMPLETED and nxt.recoveries == 0
        assert env.clock.now() - (await env.get_run("c")).created_at < 30  # (no lease expiry)
        assert await env.result("c") == 10
        ids = sorted(r.id for r in await env.store.list_runs())
        assert ids == ["c", "c~1"]


class CancelRacer(MemoryStore):
    """Lands ``engine.cancel`` of a run right before the commit of its continuation."""

    env: TestEnv | None = None
    raced = False

    async def commit(self, run_id: str, owner: str | None, now: float, update: Any) -> Any:
        if update.successor is not None and not self.raced and self.env is not None:
            self.raced = True
            await self.env.engines[0].cancel(run_id)  # (not env.cancel: it waits for idle)
        return await super().commit(run_id, owner, now, update)


async def test_a_cancel_landing_before_the_continuation_commit_wins() -> None:
    store = CancelRacer()
    async with TestEnv([Counter()], store=store) as env:
        store.env = env
        await env.start("counter", {"n": 0, "until": 1}, "c")
        await env.run_until_idle()
        assert store.raced
        run = await env.get_run("c")
        assert run.status is RunStatus.CANCELLED and run.continued_as is None
        assert run.recoveries == 0  # settled by the same activation, not after a lease expiry
        assert await env.store.get_run("c~1") is None
        types = [e.type for e in (await env.history("c")).events]
        assert "run_continued" not in types and types[-1] == "run_cancelled"


@workflow(name="undoing-loop")
class UndoingLoop:
    """Registers a compensation, then continues as new (its first run only)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def act(self, n: int) -> int:
        self.log.append(f"act {n}")
        return n

    def undo(self, n: int) -> None:
        self.log.append(f"undo {n}")

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        await ctx.step(self.act, n, compensate=self.undo)
        if n == 0:
            ctx.continue_as_new(1)
        return n


async def test_a_compensating_cancel_landing_before_the_continuation_runs_the_undos(
    store: Any,
) -> None:
    """``engine.cancel(run_id, compensate=True)`` that lands right before the continuation's
    commit wins, and the cancellation is the compensating one: the undo runs, then the run
    settles ``cancelled`` with no successor."""
    from flowkit.events import CancelRequested
    from flowkit.stores.base import Update

    wf = UndoingLoop()
    commit = store.commit

    async def cancel_first(run_id: str, owner: Any, now: float, update: Update) -> Any:
        if update.successor is not None:
            await commit(
                run_id,
                None,
                now,
                Update(
                    events=[CancelRequested(at=now, compensate=True)],
                    status=RunStatus.CANCELLING,
                    wake_at=now,
                    expect_status=frozenset({RunStatus.RUNNING}),
                    ignore_lease=True,
                ),
            )
        return await commit(run_id, owner, now, update)

    store.commit = cancel_first
    async with TestEnv([wf], store=store) as env:
        await env.start("undoing-loop", 0, "u")
        await env.run_until_idle()
        run = await env.get_run("u")
        assert run.status is RunStatus.CANCELLED and run.continued_as is None
        assert wf.log == ["act 0", "undo 0"]
        assert (await env.history("u")).types[-2:] == ["compensation_completed", "run_cancelled"]
        assert await store.get_run("u~1") is None
