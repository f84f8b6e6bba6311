"""Continue-as-new keeps the inbox (docs/composing-workflows.md, "Signals and updates follow
the chain"): the signals and updates a run had not taken move to its successor in the
continuation's transaction, in order; a signal or update sent to a run that continued as new
goes to the last run of its chain (the engine follows the chain, and so does the store's
``deliver_signal`` in its own transaction, for a continuation that lands meanwhile); a pending
``engine.update`` gets its reply from the successor. A signal racing the continuation ends up
exactly once in the chain: with real concurrency on SQLite and PostgreSQL, and in ``TestEnv``
with crashes around the continuation's commit. On MemoryStore, a SQLite file and PostgreSQL,
plain and under ``CodecStore``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from flowkit import Engine, Run, RunStatus, WorkflowCtx, workflow
from flowkit._model.payloads import inbox_name
from flowkit._replay.children import WAKE_PREFIX, wake_signal
from flowkit.errors import CodecError, RunStateError, UpdateNotRepliedError
from flowkit.events import SignalReceived, UpdateReceived
from flowkit.stores import CodecStore, MemoryStore
from flowkit.stores.base import EVENT_MARK_PREFIX, STAYING_PREFIXES, moves_to_successor
from flowkit_testing import TestEnv

try:
    from store_kit import PG, make_backend
    from store_kit import codec as make_codec
except ImportError:  # tests/ imported as a package
    from tests.store_kit import PG, make_backend
    from tests.store_kit import codec as make_codec

T = TypeVar("T")
T0 = 1_700_000_000.0


@workflow(name="relay")
class Relay:
    """Round 0 waits for ``go`` and continues as new; round 1 takes ``a``, ``b``, ``a`` and
    two updates ``change``, and returns what it got."""

    async def run(self, ctx: WorkflowCtx, n: int) -> dict[str, Any]:
        if n == 0:
            await ctx.wait_for_signal("go")
            ctx.continue_as_new(1)
        got = [await ctx.wait_for_signal(s) for s in ("a", "b", "a")]
        replies = []
        for _ in range(2):
            upd = await ctx.wait_for_update("change")
            replies.append(upd.arg)
            await upd.reply(f"changed to {upd.arg} by {ctx.run_id}")
        return {"got": got, "updates": replies}


async def _in_background(env: TestEnv, aw: Awaitable[T]) -> asyncio.Future[T]:
    """``aw`` (a caller waiting on the runs) started, and the environment settled."""
    task = asyncio.ensure_future(aw)
    await env.settle()
    return task


async def _last(store: Any, run_id: str) -> Any:
    """The last run of ``run_id``'s chain."""
    run = await store.get_run(run_id)
    while run.continued_as is not None:
        run = await store.get_run(run.continued_as)
    return run


def _received(history: Any) -> list[tuple[str, Any]]:
    return [
        (e.name, e.payload) if isinstance(e, SignalReceived) else ("update", e.arg)
        for e in history
        if isinstance(e, SignalReceived | UpdateReceived)
    ]


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "codec"])
async def test_signals_and_updates_not_taken_move_to_the_successor(
    store: Any, encrypted: bool
) -> None:
    s = CodecStore(store, make_codec()) if encrypted else store
    async with TestEnv([Relay()], store=s) as env:
        eng = env.engines[0]
        await env.start("relay", 0, "r")
        await env.run_until_idle()
        # sent while round 0 waits for ``go``: none of them is its to take
        await env.signal("r", "a", 1)
        await env.signal("r", "b", 2)
        first = await _in_background(env, eng.update("r", "change", "x", timeout=30))
        await env.signal("r", "go")
        await env.run_until_idle()
        assert (await env.get_run("r")).continued_as == "r~1"
        # sent to the old id after the continuation: on to the chain's last run
        await env.signal("r", "a", 3)
        second = await _in_background(env, eng.update("r", "change", "y", timeout=30))
        await env.run_until_idle()
        assert await asyncio.wait_for(first, 30) == "changed to x by r~1"
        assert await asyncio.wait_for(second, 30) == "changed to y by r~1"
        assert await env.result("r") == {"got": [1, 2, 3], "updates": ["x", "y"]}
        assert _received(await env.history("r")) == [("go", None)]
        assert _received(await env.history("r~1")) == [
            ("a", 1),
            ("b", 2),
            ("a", 3),
            ("update", "x"),
            ("update", "y"),
        ]
        # the chain's last run settled: refused, naming it
        with pytest.raises(RunStateError, match=r"run 'r~1' is completed"):
            await env.signal("r", "a", 4)
        with pytest.raises(RunStateError, match=r"run 'r~1' is completed"):
            await eng.update("r", "change", "z")


@workflow(name="taker")
class Taker:
    """Takes an update and continues as new without replying."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        if n == 0:
            await ctx.wait_for_update("change")
            ctx.continue_as_new(1)
        await ctx.wait_for_signal("never")
        return n


async def test_an_update_taken_then_left_unreplied_by_a_continuation_is_not_moved() -> None:
    async with TestEnv([Taker()]) as env:
        await env.start("taker", 0, "t")
        await env.run_until_idle()
        pending = await _in_background(env, env.engines[0].update("t", "change", 1, timeout=30))
        await env.run_until_idle()
        assert (await env.get_run("t")).continued_as == "t~1"
        with pytest.raises(UpdateNotRepliedError):
            await asyncio.wait_for(pending, 30)
        assert _received(await env.history("t~1")) == []


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "codec"])
async def test_the_store_moves_the_inbox_and_follows_the_chain(store: Any, encrypted: bool) -> None:
    """At the store's seam: the continuation's commit moves what its run had not taken (in
    order, the marks of published events excepted), and ``deliver_signal`` to a run that
    continued as new (as when the continuation lands between the engine's read and its
    delivery) goes to the last run of the chain and returns that run."""
    s = CodecStore(store, make_codec()) if encrypted else store
    async with TestEnv([Relay()], store=s) as env:
        await env.start("relay", 0, "q")
        await env.run_until_idle()
        for i in range(3):
            await s.deliver_signal("q", "a", {"i": i}, env.clock.now())
        await env.signal("q", "go")
        await env.run_until_idle()
        got = await s.deliver_signal("q", "b", {"late": True}, env.clock.now())
        assert got.id == "q~1"
        assert await s.peek_signal("q", "a") is None and await s.peek_signal("q", "b") is None
        nxt = await s.get_run("q~1")
        assert nxt is not None and nxt.status.active
        # (the successor took the first ``a``: its ``wait_for_signal`` ran)
        assert _received(await env.history("q~1")) == [("a", {"i": 0})]
        assert (await s.peek_signal("q~1", "b")).payload == {"late": True}
        assert (await s.peek_signal("q~1", "a")).payload == {"i": 1}


@workflow(name="sink")
class Sink:
    """Takes ``per_run`` signals ``tick`` per run of its chain and continues as new with
    what it got, until it has ``total``; returns them all."""

    async def run(self, ctx: WorkflowCtx, state: dict[str, Any]) -> list[int]:
        got: list[int] = list(state["got"])
        for _ in range(state["per_run"]):
            if len(got) == state["total"]:
                return got
            got.append(await ctx.wait_for_signal("tick"))
        if len(got) == state["total"]:
            return got
        ctx.continue_as_new({**state, "got": got})


@pytest.fixture(params=["sqlite", PG])
def sql_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_signals_racing_continuations_arrive_exactly_once(
    sql_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Real concurrency: a worker engine runs a chain that continues every 3 signals while
    four senders (another engine, on connections of its own) signal its first id as fast
    as they can; every signal is taken once, by some run of the chain."""
    total, senders = 48, 4
    b = make_backend(sql_kind, request, tmp_path)
    try:
        state = {"got": [], "per_run": 3, "total": total}
        async with Engine(b.store, [Sink()], poll_interval=0.02) as worker:
            client = Engine(b.another(), [Sink()], worker=False)
            await client.start("sink", state, "s")

            async def send(k: int) -> None:
                for i in range(k, total, senders):
                    await client.signal("s", "tick", i)

            await asyncio.gather(*(send(k) for k in range(senders)))
            got = await worker.result("s", timeout=60)
        assert sorted(got) == list(range(total))  # each once: none lost, none twice
        runs = await b.store.list_runs(workflow="sink")
        assert len(runs) == total // 3 and all(r.status is RunStatus.COMPLETED for r in runs)
        for r in runs:  # nothing left behind in any inbox
            assert await b.store.peek_signal(r.id, "tick") is None
    finally:
        b.close()


@pytest.mark.parametrize("point", ["before_continuation", "after_continuation"])
@pytest.mark.parametrize("seed", range(6))
async def test_signals_around_a_crashing_continuation_arrive_exactly_once(
    point: str, seed: int
) -> None:
    """``TestEnv``: the seed interleaves a sender with a chain continuing every 2 signals on
    two instances, and instance 0 dies right before (or right after) a continuation's
    commit; once it is back and the lease expired, every signal was taken exactly once."""
    total = 10
    async with TestEnv([Sink()], store=MemoryStore(), instances=2, seed=seed) as env:
        env.crash_at(0, point)
        eng1 = env.engines[1]
        await env.engines[0].start("sink", {"got": [], "per_run": 2, "total": total}, "s")

        async def send() -> None:
            for i in range(total):
                await eng1.signal("s", "tick", i)

        sender = asyncio.ensure_future(send())
        for _ in range(40):
            await env.run_until_idle()
            if env.crashed:
                await env.restart(0)
                await env.advance(31)
            if sender.done() and (await _last(env.store, "s")).status.terminal:
                break
        await asyncio.wait_for(sender, 30)
        await env.advance(31)
        await env.run_until_idle()
        got = await eng1.result("s", timeout=30)
        assert sorted(got) == list(range(total))


def test_the_signals_that_stay_with_their_run() -> None:
    """A child's wake-up and an event's mark are the run's own: they never follow the chain."""
    assert WAKE_PREFIX in STAYING_PREFIXES and EVENT_MARK_PREFIX in STAYING_PREFIXES
    assert moves_to_successor("a") and moves_to_successor(inbox_name("change"))
    assert not moves_to_successor(wake_signal("r.child.1"))


async def test_a_codec_inbox_is_bound_to_its_chain_and_reads_older_bindings() -> None:
    """``CodecStore`` binds an inbox payload to the chain's first id: it decodes in any run
    of the chain, fails in another chain's run, and one written bound to its own run (before
    this binding) still decodes there."""
    inner = MemoryStore()
    c = make_codec()
    s = CodecStore(inner, c)
    for rid in ("r", "r~2", "other~2"):
        run = Run(rid, "wf", "1", RunStatus.PENDING, None, created_at=T0, updated_at=T0)
        await inner.create_run(run, [])
    await inner.deliver_signal("r~2", "a", c.encode({"n": 1}, context=("r", "signal", "a")), T0)
    assert (await s.peek_signal("r~2", "a")).payload == {"n": 1}
    old = c.encode({"n": 2}, context=("r~2", "signal", "b"))  # (the binding before)
    await inner.deliver_signal("r~2", "b", old, T0)
    assert (await s.peek_signal("r~2", "b")).payload == {"n": 2}
    moved = c.encode({"n": 3}, context=("r", "signal", "c"))  # (pasted into another chain)
    await inner.deliver_signal("other~2", "c", moved, T0)
    with pytest.raises(CodecError):
        await s.peek_signal("other~2", "c")
