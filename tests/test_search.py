"""Search attributes (docs/search-and-retention.md): ``engine.start(search=...)``,
``ctx.upsert_search`` (event ``search_upserted``, awaited or riding with the next write),
``list_runs(search=...)`` with every operator, keyset paging (``limit``/``after``) and rows without
payloads. On MemoryStore, a SQLite file and PostgreSQL (the ``store`` fixture), in ``TestEnv``."""

from __future__ import annotations

from typing import Any

import pytest

from flowkit import (
    Engine,
    InvalidInputError,
    NonDeterminismError,
    RunStatus,
    WorkflowCtx,
    replay,
    workflow,
)
from flowkit.events import SearchUpserted
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore
from flowkit_testing import TestEnv


async def bump(x: int) -> int:
    return x + 1


@workflow(name="order")
class Order:
    """Upserts its attributes as it goes: awaited, and not awaited (with the next write)."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        await ctx.upsert_search(stage="paid", amount=input["amount"])
        n = await ctx.step(bump, 1)
        ctx.upsert_search(stage="shipped", vip=input["amount"] > 100)  # (not awaited)
        await ctx.step(bump, n)
        if input.get("wait"):
            await ctx.wait_for_signal("go")
        return "done"


async def _three(env: TestEnv) -> None:
    for i, amount in enumerate((50, 150, 120)):
        await env.start(
            "order", {"amount": amount}, f"o{i}", search={"customer": f"c-{i % 2}", "n": i}
        )


async def test_start_and_upserts_set_the_runs_search_attributes(store: Any) -> None:
    async with TestEnv([Order()], store=store) as env:
        await _three(env)
        run = await env.get_run("o1")
        assert run.status is RunStatus.COMPLETED
        assert run.search == {
            "customer": "c-1",
            "n": 1,
            "stage": "shipped",
            "amount": 150,
            "vip": True,
        }
        evs = [e for e in (await env.history("o1")).events if isinstance(e, SearchUpserted)]
        assert [e.attrs for e in evs] == [
            {"stage": "paid", "amount": 150},
            {"stage": "shipped", "vip": True},
        ]
        assert [e.pos for e in evs] == ["1", "3"]


async def test_list_runs_filters_with_every_operator(store: Any) -> None:
    async with TestEnv([Order()], store=store) as env:
        await _three(env)
        eng = env.engines[0]

        async def ids(**search: Any) -> list[str]:
            return [r.id for r in await eng.list_runs(search=search)]

        assert await ids(customer="c-0") == ["o0", "o2"]
        assert await ids(customer=("==", "c-1")) == ["o1"]
        assert await ids(customer=("!=", "c-1")) == ["o0", "o2"]
        assert await ids(amount=(">", 100)) == ["o1", "o2"]
        assert await ids(amount=(">=", 120)) == ["o1", "o2"]
        assert await ids(amount=("<", 120)) == ["o0"]
        assert await ids(amount=("<=", 120.0)) == ["o0", "o2"]  # (int and float: numbers)
        assert await ids(amount=("in", [50, 150])) == ["o0", "o1"]
        assert await ids(customer=("in", ())) == []
        assert await ids(customer="c-0", vip=True) == ["o2"]  # (AND)
        assert await ids(vip=True) == ["o1", "o2"]
        assert await ids(vip=1) == []  # a bool is not a number
        assert await ids(n=True) == []
        assert await ids(n=0) == ["o0"]
        assert await ids(customer=("<", "c-1")) == ["o0", "o2"]  # (strings by code point)
        assert await ids(customer=1) == []  # other kinds never equal
        assert await ids(nope="x") == []
        assert await ids(nope=("!=", "x")) == []  # (no attribute: no match)
        both = await eng.list_runs(workflow="order", status="completed", search={"n": 2})
        assert [r.id for r in both] == ["o2"]


async def test_list_rows_carry_no_payloads(store: Any) -> None:
    async with TestEnv([Order()], store=store) as env:
        await _three(env)
        listed = await env.engines[0].list_runs()
        assert [r.id for r in listed] == ["o0", "o1", "o2"]
        assert all(r.input is None and r.output is None and r.error is None for r in listed)
        assert listed[0].search["customer"] == "c-0"  # (but search attributes and the rest)
        full = await env.get_run("o0")
        assert full.input == {"amount": 50} and full.output == "done"


async def test_paging_gives_the_unpaged_list(store: Any) -> None:
    async with TestEnv([Order()], store=store) as env:
        eng = env.engines[0]
        for i in range(7):
            await eng.start("order", {"amount": i, "wait": True}, f"p{i}", search={"k": i % 3})
        await env.settle()
        for search in (None, {"k": ("!=", 1)}, {"amount": (">=", 2)}):
            whole = [r.id for r in await eng.list_runs(search=search)]
            for size in (1, 2, 3, 10):
                got: list[str] = []
                page = await eng.list_runs(search=search, limit=size)
                while page:
                    got += [r.id for r in page]
                    page = await eng.list_runs(search=search, limit=size, after=page[-1])
                assert got == whole, (search, size)


@pytest.mark.parametrize(
    "attrs",
    [
        {"bad-name": 1},
        {"x": None},
        {"x": [1]},
        {"x": float("nan")},
        {"x": 2**60},
        {"x": "a" * 256},
        {"x": "nul\x00"},
        {f"a{i}": i for i in range(33)},
    ],
)
async def test_bad_attributes_at_start_write_nothing(store: Any, attrs: dict[str, Any]) -> None:
    async with TestEnv([Order()], store=store) as env:
        with pytest.raises(InvalidInputError):
            await env.start("order", {"amount": 1}, "bad", search=attrs)
        assert await env.engines[0].list_runs() == []


@pytest.mark.parametrize(
    "search",
    [{"x": ("~", 1)}, {"x": ("<", True)}, {"x": ("in", 1)}, {"x": [1, 2]}, {"x": {"a": 1}}],
)
async def test_bad_filters_are_refused(search: dict[str, Any]) -> None:
    async with Engine(MemoryStore(), [Order()], worker=False) as eng:
        with pytest.raises(InvalidInputError):
            await eng.list_runs(search=search)


@workflow(name="careless")
class Careless:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            await ctx.upsert_search(**{"x": object()})  # type: ignore[arg-type]
        except InvalidInputError:
            return "refused"
        return "taken"


async def test_a_bad_upsert_raises_in_the_body_and_writes_nothing(store: Any) -> None:
    async with TestEnv([Careless()], store=store) as env:
        await env.start("careless", None, "c")
        assert await env.result("c") == "refused"
        assert (await env.get_run("c")).search == {}
        types = [e.type for e in (await env.history("c")).events]
        assert "search_upserted" not in types


@workflow(name="order")
class OrderChanged:
    """``Order`` with its first upsert setting other attributes: a replay diverges."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        await ctx.upsert_search(state="paid")
        await ctx.step(bump, 1)
        return "done"


@workflow(name="order")
class OrderNewValues:
    """``Order`` with other values at the same positions: replays (values are not matched)."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        await ctx.upsert_search(stage="PAID", amount=0)
        n = await ctx.step(bump, 1)
        ctx.upsert_search(stage="SHIPPED", vip=False)
        await ctx.step(bump, n)
        return "done"


async def test_a_changed_body_diverges_on_replay() -> None:
    async with TestEnv([Order()]) as env:
        await env.start("order", {"amount": 5}, "o")
        history = await env.history("o")
    with pytest.raises(NonDeterminismError) as err:
        await _replay(history, OrderChanged)
    assert "upsert_search" in str(err.value)
    await _replay(history, OrderNewValues)
    await _replay(history, Order)


async def _replay(history: Any, wf: Any) -> None:
    from flowkit._replay.replayer import replay_async

    await replay_async(history, wf)


def test_replay_in_a_plain_function() -> None:
    """``flowkit.replay`` (sync) replays a history with upserts."""
    import asyncio

    async def record() -> Any:
        async with TestEnv([Order()]) as env:
            await env.start("order", {"amount": 5}, "o")
            return await env.history("o")

    replay(asyncio.run(record()), Order)


@workflow(name="looper")
class Looper:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        ctx.upsert_search(round=input)
        if input < 2:
            ctx.continue_as_new(input + 1)
        return input


@workflow(name="parent")
class Parent:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        await ctx.upsert_search(role="parent")
        result: int = await ctx.child("looper", 2, run_id="kid")
        return result


async def test_successors_carry_the_attributes_and_children_do_not(store: Any) -> None:
    async with TestEnv([Looper(), Parent()], store=store) as env:
        await env.start("looper", 0, "l", search={"team": "a"})
        assert await env.result("l") == 2
        for rid, rnd in (("l", 0), ("l~1", 1), ("l~2", 2)):
            assert (await env.get_run(rid)).search == {"team": "a", "round": rnd}
        listed = await env.engines[0].list_runs(search={"team": "a"})
        assert [r.id for r in listed] == ["l", "l~1", "l~2"]
        await env.start("parent", None, "p", search={"team": "b"})
        assert await env.result("p") == 2
        assert (await env.get_run("kid")).search == {"round": 2}
        assert (await env.get_run("p")).search == {"team": "b", "role": "parent"}


async def test_codec_store_keeps_search_attributes_in_clear() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, AESGCMCodec([("k1", b"0" * 32)]))
    async with TestEnv([Order()], store=store) as env:
        await env.start("order", {"amount": 150}, "o", search={"customer": "c-9"})
        raw = await inner.get_run("o")
        assert raw is not None and raw.search["customer"] == "c-9"
        assert raw.output != "done"  # (payloads are encoded)
        listed = await env.engines[0].list_runs(search={"customer": "c-9", "vip": True})
        assert [r.id for r in listed] == ["o"]
        evs = [e for e in (await inner.load_events("o")) if isinstance(e, SearchUpserted)]
        assert evs[0].attrs == {"stage": "paid", "amount": 150}
