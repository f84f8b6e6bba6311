"""Published values (``ctx.set_event`` / ``engine.get_event``), updates (``engine.update`` /
``ctx.wait_for_update`` / ``upd.reply`` / ``@update_validator``) and typed signals
(``@workflow(signals=...)``), docs/updates.md: on MemoryStore, a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

import flowkit
from flowkit import RunStatus, WorkflowCtx, update_validator, workflow
from flowkit.errors import (
    InvalidInputError,
    NonDeterminismError,
    ResultTimeoutError,
    RunNotFoundError,
    RunStateError,
    SignalTimeout,
    UpdateNotRepliedError,
    UpdateRejectedError,
)
from flowkit.events import EventSet, UpdateReceived, UpdateReplied
from flowkit.stores import SqlStore
from flowkit.stores.codec import CodecStore
from flowkit_testing import TestEnv

try:
    from store_kit import Backend, codec
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend, codec

T = TypeVar("T")


class Change(BaseModel):
    amount: int


class Approval(BaseModel):
    by: str


@workflow(name="desk", updates={"change": Change}, signals={"approve": Approval})
class Desk:
    def __init__(self) -> None:
        self.checked: list[Change] = []

    @update_validator("change")
    def check_change(self, arg: Change) -> None:
        self.checked.append(arg)
        if arg.amount < 0:
            raise ValueError("no negative changes")

    async def run(self, ctx: WorkflowCtx, input: int) -> dict[str, Any]:
        total = input
        ctx.set_event("total", total)  # (not awaited: written with the next write)
        upd = await ctx.wait_for_update("change", timeout=3600)
        assert isinstance(upd.arg, Change)
        total += upd.arg.amount
        await upd.reply({"total": total})
        await ctx.set_event("total", total)
        approval = await ctx.wait_for_signal("approve")
        return {"total": total, "by": approval.by, "typed": isinstance(approval, Approval)}


@workflow(name="ignorer")
class Ignorer:
    """Never takes an update: it waits for ``go`` and completes."""

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        await ctx.wait_for_signal("go")
        return "done"


@workflow(name="impatient")
class Impatient:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            await ctx.wait_for_update("change", timeout=60)
        except flowkit.SignalTimeout:
            return "timed out"
        return "got one"


async def _in_background(env: TestEnv, aw: Awaitable[T]) -> T:
    """Run ``aw`` (a caller waiting on the runs) while the environment settles."""
    task = asyncio.ensure_future(aw)
    await env.settle()
    await env.run_until_idle()
    return await asyncio.wait_for(task, 30)


async def test_update_round_trip_with_published_values(backend: Backend) -> None:
    desk = Desk()
    async with TestEnv([desk, Ignorer()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("desk", 10, "d1")
        assert await eng.get_event("d1", "total", timeout=0) == 10
        assert await _in_background(env, eng.update("d1", "change", {"amount": 5})) == {"total": 15}
        assert desk.checked == [Change(amount=5)]
        assert await eng.get_event("d1", "total") == 15  # (the latest value)
        await env.signal("d1", "approve", {"by": "ann"})
        assert await env.result("d1") == {"total": 15, "by": "ann", "typed": True}
        h = await env.history("d1")
        assert [t for t in h.types if t in ("event_set", "update_received", "update_replied")] == [
            "event_set",
            "update_received",
            "update_replied",
            "event_set",
        ]
        # the history replays: the update's arg and the signal are typed again from JSON
        await flowkit.replay_async(h, Desk())


async def test_a_rejected_or_invalid_update_writes_nothing(backend: Backend) -> None:
    async with TestEnv([Desk()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("desk", 10, "d1")
        before = (await env.history("d1")).types
        run_before = await env.get_run("d1")
        with pytest.raises(UpdateRejectedError) as err:
            await eng.update("d1", "change", {"amount": -1})
        assert isinstance(err.value.cause, ValueError) and err.value.name == "change"
        with pytest.raises(InvalidInputError):
            await eng.update("d1", "change", {"amount": "lots"})
        with pytest.raises(InvalidInputError):  # (a typed signal: validated first too)
            await eng.signal("d1", "approve", {"who": "nobody"})
        with pytest.raises(InvalidInputError):  # (the updates' inbox names are reserved)
            await eng.signal("d1", "flowkit:update:change", {"amount": 1})
        await env.settle()
        assert (await env.history("d1")).types == before
        run_after = await env.get_run("d1")
        assert run_after.updated_at == run_before.updated_at
        assert await env.store.peek_signal("d1", "flowkit:update:change") is None
        assert await env.store.peek_signal("d1", "approve") is None
        # and a valid one still goes through
        assert await _in_background(env, eng.update("d1", "change", {"amount": 1})) == {"total": 11}


async def test_update_errors_unknown_terminal_and_unreplied(backend: Backend) -> None:
    async with TestEnv([Ignorer()], store=backend.store) as env:
        eng = env.engines[0]
        with pytest.raises(RunNotFoundError):
            await eng.update("nope", "change", 1)
        await env.start("ignorer", None, "i1")
        pending = asyncio.ensure_future(eng.update("i1", "change", 1))
        await env.settle()
        assert not pending.done()
        await env.signal("i1", "go")  # the run completes without replying
        with pytest.raises(UpdateNotRepliedError) as err:
            await asyncio.wait_for(pending, 30)
        assert err.value.status == "completed"
        with pytest.raises(RunStateError):  # terminal: refused, nothing written
            await eng.update("i1", "change", 1)
        assert await env.store.peek_signal("i1", "flowkit:update:change") is not None


async def test_update_timeout_raises_a_timeout_error(backend: Backend) -> None:
    async with TestEnv([Ignorer()], store=backend.store) as env:
        await env.start("ignorer", None, "i1")
        with pytest.raises(ResultTimeoutError) as err:
            await env.engines[0].update("i1", "change", 1, timeout=0.05)
        assert isinstance(err.value, TimeoutError)
        assert "has no reply yet" in str(err.value)


async def test_wait_for_update_times_out_with_signal_timeout(backend: Backend) -> None:
    async with TestEnv([Impatient()], store=backend.store) as env:
        await env.start("impatient", None, "p1")
        await env.advance(61)
        assert await env.result("p1") == "timed out"
        assert "timer_fired" in (await env.history("p1")).types
    assert issubclass(SignalTimeout, Exception)


async def test_get_event_none_for_a_settled_run_and_after_its_timeout(backend: Backend) -> None:
    async with TestEnv([Ignorer()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("ignorer", None, "i1")
        assert await eng.get_event("i1", "total", timeout=0.02) is None
        await env.signal("i1", "go")
        assert (await env.get_run("i1")).status is RunStatus.COMPLETED
        assert await eng.get_event("i1", "total") is None  # (settled: at once)
        with pytest.raises(RunNotFoundError):
            await eng.get_event("nope", "total")
        with pytest.raises(InvalidInputError):
            await eng.get_event("i1", "")


@workflow(name="publisher")
class Publisher:
    async def run(self, ctx: WorkflowCtx, input: None) -> None:
        await ctx.wait_for_signal("go")
        ctx.set_event("stage", "one")
        await ctx.set_event("stage", "two")
        await ctx.wait_for_signal("stop")


async def test_a_waiting_reader_is_woken_when_the_value_is_set(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fallback poll pushed out of reach, only the wake-up can answer the reader."""
    monkeypatch.setattr("flowkit._client.history_wait.POLL_MIN", 3600.0)
    async with TestEnv([Publisher()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("publisher", None, "p1")
        reader = asyncio.ensure_future(eng.get_event("p1", "stage"))
        await env.settle()
        assert not reader.done()
        await env.signal("p1", "go")
        assert await asyncio.wait_for(reader, 30) == "two"


@workflow(name="replier", updates={"change": Change})
class Replier:
    def __init__(self) -> None:
        self.effects = 0

    def effect(self) -> int:
        self.effects += 1
        return self.effects

    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        upd = await ctx.wait_for_update("change")
        await ctx.step(self.effect)
        await upd.reply(upd.arg.amount * 2)
        await ctx.step(self.effect)
        return upd.arg.amount


@pytest.mark.parametrize("point", ["after_update_receipt", "after_update_reply"])
async def test_the_caller_gets_exactly_the_reply_across_a_crash(
    backend: Backend, point: str
) -> None:
    """The worker dies right after recording the update's receipt, or its reply; a caller
    on another engine (a client) still gets exactly the one reply, and the step before the
    reply is not run again once the reply is recorded."""
    wf = Replier()
    async with TestEnv([wf], store=backend.store) as env:
        client = flowkit.Engine(env.store, [Replier()], clock=env.clock, bus=env.bus, worker=False)
        await env.start("replier", None, "r1")
        env.crash_at(0, point)
        caller = asyncio.ensure_future(client.update("r1", "change", {"amount": 21}))
        await env.run_until_idle()
        assert env.crashed == [0]  # the crash point fired
        assert not caller.done() or point == "after_update_reply"
        await env.advance(env.lease_ttl + 1)
        await env.restart(0)
        await env.run_until_idle()
        assert await asyncio.wait_for(caller, 30) == 42
        assert await env.result("r1") == 21
        h = await env.history("r1")
        assert h.types.count("update_received") == 1
        assert h.types.count("update_replied") == 1
        if point == "after_update_reply":
            assert wf.effects == 2  # (the step before the reply ran once)


@workflow(name="desk", updates={"change": Change}, signals={"approve": Approval})
class DeskOtherKey(Desk):
    async def run(self, ctx: WorkflowCtx, input: int) -> dict[str, Any]:
        ctx.set_event("sum", input)  # (another key at the first position)
        await ctx.wait_for_update("change", timeout=3600)
        return {}


@workflow(name="desk", updates={"change": Change}, signals={"approve": Approval})
class DeskOtherUpdate(Desk):
    async def run(self, ctx: WorkflowCtx, input: int) -> dict[str, Any]:
        ctx.set_event("total", input)
        await ctx.wait_for_update("adjust", timeout=3600)  # (another update name)
        return {}


@workflow(name="desk", updates={"change": Change}, signals={"approve": Approval})
class DeskNoReply(Desk):
    async def run(self, ctx: WorkflowCtx, input: int) -> dict[str, Any]:
        ctx.set_event("total", input)
        await ctx.wait_for_update("change", timeout=3600)
        await ctx.sleep(1)  # (where the reply was)
        return {}


@pytest.mark.parametrize("changed", [DeskOtherKey, DeskOtherUpdate, DeskNoReply])
async def test_a_changed_body_diverges_at_each_new_event(changed: type) -> None:
    async with TestEnv([Desk()]) as env:
        await env.start("desk", 10, "d1")
        await _in_background(env, env.engines[0].update("d1", "change", {"amount": 5}))
        h = await env.history("d1")
    with pytest.raises(NonDeterminismError):
        await flowkit.replay_async(h, changed())


async def test_codec_store_encrypts_values_args_and_replies(tmp_path: Any) -> None:
    """Through a ``CodecStore`` the published value, the update's arg and its reply are
    envelopes in the database (keys, names and ids stay clear) and read back in clear."""
    inner = SqlStore(f"sqlite:///{tmp_path / 'enc.db'}")
    store = CodecStore(inner, codec())
    try:
        async with TestEnv([Desk()], store=store) as env:
            eng = env.engines[0]
            await env.start("desk", 10, "d1")
            assert await eng.get_event("d1", "total") == 10
            reply = await _in_background(env, eng.update("d1", "change", {"amount": 5}))
            assert reply == {"total": 15}
            assert await eng.get_event("d1", "total") == 15
            raw = await inner.load_events("d1")
            kinds = [e for e in raw if isinstance(e, EventSet | UpdateReceived | UpdateReplied)]
            assert len(kinds) == 4
            for ev in kinds:
                secret = ev.value if isinstance(ev, EventSet | UpdateReplied) else ev.arg
                assert isinstance(secret, dict) and "$codec" in secret, ev
            found = await inner.latest_event("d1", "event_set", "key", "total")
            assert isinstance(found, EventSet) and "$codec" in found.value
    finally:
        store.close()


@pytest.mark.parametrize(
    ("event", "answered"),
    [
        (EventSet(pos="1", key="total"), {"set_event:total"}),
        (UpdateReceived(pos="1", name="change", update_id="u1"), {"wait_for_update:change"}),
        (UpdateReplied(pos="1", name="change", update_id="u1"), {"update_reply:u1"}),
    ],
    ids=lambda v: getattr(v, "type", ""),
)
def test_the_calls_each_new_event_answers(event: Any, answered: set[str]) -> None:
    """The replay rule of each event (``matching.answers``): only its own call, of its own
    key, update name or update id."""
    from flowkit._replay.matching import answers

    calls: list[tuple[Any, str]] = [
        ("set_event", "total"),
        ("set_event", "sum"),
        ("wait_for_update", "change"),
        ("wait_for_update", "adjust"),
        ("wait_for_signal", "change"),
        ("update_reply", "u1"),
        ("update_reply", "u2"),
        ("step", "total"),
    ]
    assert {f"{c}:{n}" for c, n in calls if answers(event, c, n)} == answered


def test_flowkit_history_describes_the_new_events() -> None:
    from flowkit.cli._out import EVENT_STYLE, _describe

    assert _describe(EventSet(pos="1", key="total", value={"n": 1}), 0.0) == 'total = {"n":1}'
    got = _describe(UpdateReceived(pos="2", name="change", update_id="ab", arg=5), 0.0)
    assert got == "change (ab) arg 5"
    got = _describe(UpdateReplied(pos="3", name="change", update_id="ab", value="ok"), 0.0)
    assert got == 'change (ab) -> "ok"'
    assert {"event_set", "update_received", "update_replied"} <= set(EVENT_STYLE)


async def test_update_needs_the_workflow_registered_here(backend: Backend) -> None:
    """Its types and validator are needed: an engine without the workflow writes nothing."""
    async with TestEnv([Desk()], store=backend.store) as env:
        await env.start("desk", 10, "d1")
        client = flowkit.Engine(env.store, [], clock=env.clock, worker=False)
        with pytest.raises(flowkit.errors.WorkflowNotFoundError):
            await client.update("d1", "change", {"amount": 1})
        assert await env.store.peek_signal("d1", "flowkit:update:change") is None


@workflow(name="twice")
class Twice:
    """Replies to one update twice: the second reply must fail in the body, not race the
    first at the caller."""

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        upd = await ctx.wait_for_update("x")
        await upd.reply("first")
        try:
            await upd.reply("second")
        except RuntimeError as exc:
            return str(exc)
        return "replied twice"


async def test_an_update_takes_one_reply(backend: Backend) -> None:
    async with TestEnv([Twice()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("twice", None, "t1")
        assert await _in_background(env, eng.update("t1", "x", 1)) == "first"
        assert "already replied" in await env.result("t1")
        h = await env.history("t1")
        assert h.types.count("update_replied") == 1
        await flowkit.replay_async(h, Twice())


@workflow(name="generations")
class Generations:
    """Sets ``stage`` in its first run (only when ``input`` is 0), continues as new, and
    sets it again in the successor once signalled."""

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        if input == 0:
            await ctx.set_event("stage", "first generation")
            ctx.continue_as_new(1)
        await ctx.wait_for_signal("go")
        await ctx.set_event("stage", "second generation")
        await ctx.wait_for_signal("stop")
        return input


async def test_get_event_follows_a_continued_run(backend: Backend) -> None:
    async with TestEnv([Generations()], store=backend.store) as env:
        eng = env.engines[0]
        await env.start("generations", 0, "g")
        await env.run_until_idle()
        # the successor set nothing yet: the chain's newest value is its predecessor's
        assert await eng.get_event("g", "stage", timeout=0) == "first generation"
        await env.signal("g~1", "go")
        await env.run_until_idle()
        assert await eng.get_event("g", "stage", timeout=0) == "second generation"
        assert await eng.get_event("g~1", "stage", timeout=0) == "second generation"
