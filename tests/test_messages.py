"""Messages checked before anything is written (docs/updates.md, "Unknown names are refused"
and "Callers without the code"): a workflow that declares its messages refuses other names,
``flowkit:`` names are refused always, and a caller without the workflow's code
(``Engine(store, [])``, ``flowkit signal``, ``flowkit retry --input``, the dashboard)
validates against the JSON schemas its workers recorded in the store. On MemoryStore, a
SQLite file and PostgreSQL; the command line as a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
import ui_kit
from cli_kit import flowkit
from pydantic import BaseModel
from test_ui_actions import _post as _ui_post

from flowkit import Engine, RunStatus, WorkflowCtx, update_validator, workflow
from flowkit._client import schemas as _schemas
from flowkit._model.payloads import inbox_name
from flowkit.errors import (
    InvalidInputError,
    UpdateRejectedError,
    WorkflowFailedError,
    WorkflowNotFoundError,
)
from flowkit.stores import MemoryStore, SqlStore
from flowkit.stores.codec import CodecStore
from flowkit_testing import TestEnv

try:
    from store_kit import Backend, codec
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend, codec

T = TypeVar("T")


class OrderIn(BaseModel):
    sku: str
    qty: int


class Shipment(BaseModel):
    carrier: str
    tracking: int


class Address(BaseModel):
    street: str


@workflow(
    name="order",
    signals={"shipped": Shipment, "note": None},
    updates={"change_address": Address, "cancel_item": None},
)
class Order:
    """Takes an address change (answered), then waits for its shipment."""

    @update_validator("cancel_item")
    def check_cancel(self, arg: Any) -> None:
        """(Only the code can run it: a caller without it cannot send ``cancel_item``.)"""

    async def run(self, ctx: WorkflowCtx, input: OrderIn) -> str:
        upd = await ctx.wait_for_update("change_address")
        await upd.reply(f"to {upd.arg.street}")
        shipment = await ctx.wait_for_signal("shipped")
        assert isinstance(shipment, Shipment)
        return f"{input.qty} x {input.sku} to {upd.arg.street} by {shipment.carrier}"


@workflow(name="loose")
class Loose:
    """Declares no messages: any signal name is accepted, and any update name."""

    async def run(self, ctx: WorkflowCtx, input: None) -> Any:
        return await ctx.wait_for_signal("whatever")


@workflow(name="halver")
class Halver:
    """Fails on an odd input (to be retried with another)."""

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        if input % 2:
            raise ValueError("odd")
        return input // 2


def _client(env: TestEnv) -> Engine:
    """An engine without any workflow's code on the environment's store."""
    return Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)


async def _in_background(env: TestEnv, aw: Awaitable[T]) -> T:
    task = asyncio.ensure_future(aw)
    await env.settle()
    await env.run_until_idle()
    return await asyncio.wait_for(task, 30)


async def _written(env: TestEnv, run_id: str, *names: str) -> tuple[int, list[str]]:
    """The run's history length and which of the inbox ``names`` hold a signal."""
    held = [n for n in names if await env.store.peek_signal(run_id, n) is not None]
    return len(await env.history(run_id)), held


async def test_a_typo_in_a_signal_payload_from_a_caller_without_the_code(
    backend: Backend,
) -> None:
    """The issue's order: a bad payload sent without the code used to be stored, failing the
    body (and again on every retry); it is refused with nothing written, and a good one
    reaches the body as a ``Shipment``."""
    async with TestEnv([Order()], store=backend.store) as env:
        await env.start("order", {"sku": "A-1", "qty": 2}, "o1")
        eng = env.engines[0]
        reply = await _in_background(env, eng.update("o1", "change_address", {"street": "X"}))
        assert reply == "to X"
        client = _client(env)
        before = await _written(env, "o1", "shipped")
        with pytest.raises(InvalidInputError, match=r"shipped.*tracking.*'integer'"):
            await client.signal("o1", "shipped", {"carrier": "dhl", "tracking": "12a"})
        with pytest.raises(InvalidInputError, match="carrier"):
            await client.signal("o1", "shipped", {"tracking": 12})
        assert await _written(env, "o1", "shipped") == before == (before[0], [])
        await env.run_until_idle()
        assert (await env.get_run("o1")).status is RunStatus.SUSPENDED
        await client.signal("o1", "shipped", {"carrier": "dhl", "tracking": 12})
        await env.run_until_idle()
        assert await env.result("o1") == "2 x A-1 to X by dhl"


async def test_undeclared_names_are_refused_with_and_without_the_code(backend: Backend) -> None:
    """A workflow that declares its messages refuses any other signal (``InvalidInputError``)
    or update (``UpdateRejectedError``) name, from an engine with its code and from one
    without; nothing is written, and the caller does not wait."""
    async with TestEnv([Order()], store=backend.store) as env:
        await env.start("order", {"sku": "A-1", "qty": 1}, "o2")
        await env.run_until_idle()
        names = ("shiped", inbox_name("change_adress"))
        before = await _written(env, "o2", *names)
        for caller in (env.engines[0], _client(env)):
            with pytest.raises(InvalidInputError, match="declares no signal 'shiped'"):
                await caller.signal("o2", "shiped", {"carrier": "dhl", "tracking": 1})
            with pytest.raises(UpdateRejectedError, match="declares no update 'change_adress'"):
                await caller.update("o2", "change_adress", {"street": "Y"}, timeout=5)
        assert await _written(env, "o2", *names) == before == (before[0], [])
        # a declared untyped signal takes any JSON value
        await _client(env).signal("o2", "note", ["any", {"json": 1}])
        assert await env.store.peek_signal("o2", "note") is not None


async def test_reserved_names_are_refused_and_undeclared_workflows_take_any_name(
    backend: Backend,
) -> None:
    """``flowkit:`` names are flowkit's own whatever the workflow declares; a workflow that
    declares nothing still takes any other signal name (untyped)."""
    async with TestEnv([Loose()], store=backend.store) as env:
        await env.start("loose", None, "l1")
        await env.run_until_idle()
        before = await _written(env, "l1", "flowkit:x", "flowkit:child:x")
        for caller in (env.engines[0], _client(env)):
            for name in ("flowkit:x", "flowkit:child:x", "flowkit:update:x"):
                with pytest.raises(InvalidInputError, match="reserved"):
                    await caller.signal("l1", name, 1)
            with pytest.raises(InvalidInputError, match="reserved"):
                await caller.update("l1", "flowkit:x", 1, timeout=5)
        assert await _written(env, "l1", "flowkit:x", "flowkit:child:x") == before
        await _client(env).signal("l1", "whatever", {"free": "form"})
        await env.run_until_idle()
        assert await env.result("l1") == {"free": "form"}


def test_a_workflow_cannot_declare_a_reserved_name() -> None:
    for kw in ({"signals": {"flowkit:go": int}}, {"updates": {"flowkit:go": int}}):
        with pytest.raises(ValueError, match="'flowkit:' is reserved"):

            @workflow(name="reserved", **kw)
            class Reserved:
                async def run(self, ctx: WorkflowCtx, input: None) -> None:
                    return None


async def test_updates_from_a_caller_without_the_code(backend: Backend) -> None:
    """An update's argument is checked against the recorded schema (``InvalidInputError``,
    nothing written); an update with an ``@update_validator`` needs the code
    (``WorkflowNotFoundError``)."""
    async with TestEnv([Order()], store=backend.store) as env:
        await env.start("order", {"sku": "A-1", "qty": 1}, "o3")
        await env.run_until_idle()
        client = _client(env)
        before = await _written(env, "o3", inbox_name("change_address"))
        with pytest.raises(InvalidInputError, match=r"change_address.*street"):
            await client.update("o3", "change_address", {"road": "Y"}, timeout=5)
        with pytest.raises(WorkflowNotFoundError):
            await client.update("o3", "cancel_item", 1, timeout=5)
        assert await _written(env, "o3", inbox_name("change_address")) == before
        reply = await _in_background(env, client.update("o3", "change_address", {"street": "Y"}))
        assert reply == "to Y"


async def test_retry_input_from_a_caller_without_the_code(backend: Backend) -> None:
    async with TestEnv([Halver()], store=backend.store) as env:
        await env.start("halver", 3, "h1")
        await env.run_until_idle()
        with pytest.raises(WorkflowFailedError):
            await env.result("h1")
        client = _client(env)
        before = len(await env.history("h1"))
        with pytest.raises(InvalidInputError, match="input: 'four' is not of type 'integer'"):
            await client.retry("h1", input="four")
        assert len(await env.history("h1")) == before
        assert (await env.get_run("h1")).status is RunStatus.FAILED
        await client.retry("h1", input=4)
        await env.run_until_idle()
        assert await env.result("h1") == 2


class StoreWithoutSchemas(MemoryStore):
    """A store that keeps no schemas (a custom store written before the capability)."""

    records_schemas = False


async def test_without_recorded_schemas_a_caller_without_the_code_checks_nothing() -> None:
    """As before the capability: the payload is only checked to be storable."""
    async with TestEnv([Order()], store=StoreWithoutSchemas()) as env:
        await env.start("order", {"sku": "A-1", "qty": 1}, "o4")
        await env.run_until_idle()
        await _client(env).signal("o4", "shiped", {"tracking": "x"})
        assert await env.store.peek_signal("o4", "shiped") is not None


async def test_codec_store_keeps_the_schemas_encoded() -> None:
    """Through a ``CodecStore`` the document is encoded at rest (a schema's defaults may hold
    values); a caller through the codec still validates with it."""
    inner = MemoryStore()
    store = CodecStore(inner, codec())
    assert store.records_schemas
    async with TestEnv([Order()], store=store) as env:
        await env.start("order", {"sku": "A-1", "qty": 1}, "o5")
        await env.run_until_idle()
        raw = await inner.workflow_schema("order", "1")
        assert raw["$codec"] == "aesgcm" and "tracking" not in str(raw)
        # (read without the codec it is no document: such a caller checks nothing by it)
        assert await _schemas.recorded(inner, await env.get_run("o5")) is None
        doc = await store.workflow_schema("order", "1")
        assert doc["signals"]["shipped"]["properties"]["tracking"] == {
            "title": "Tracking",
            "type": "integer",
        }
        with pytest.raises(InvalidInputError, match="tracking"):
            await _client(env).signal("o5", "shipped", {"carrier": "x", "tracking": "y"})


async def test_the_recorded_document(backend: Backend) -> None:
    """What a worker records when it starts: per ``(workflow, version)``, the input's and
    messages' schemas and the declared names; a second start replaces it (one row)."""
    store = backend.store
    assert await store.workflow_schema("order", "1") is None
    for _ in range(2):
        async with Engine(store, [Order(), Loose()], poll_interval=None):
            pass
    doc = await backend.another().workflow_schema("order", "1")
    assert doc["format"] == 1 and doc["declares"] is True
    assert doc["input"]["required"] == ["sku", "qty"]
    assert set(doc["signals"]) == {"shipped", "note"} and doc["signals"]["note"] is None
    assert set(doc["updates"]) == {"change_address", "cancel_item"}
    assert doc["validators"] == ["cancel_item"]
    loose = await store.workflow_schema("loose", "1")
    assert (
        loose["declares"] is False and loose["signals"] == {} and loose["input"] == {"type": "null"}
    )
    assert await store.workflow_schema("order", "2") is None
    if backend.url is not None:
        engine = sa.create_engine(backend.url)
        try:
            with engine.connect() as conn:
                n = conn.execute(sa.text("SELECT count(*) FROM flowkit_workflow_schemas"))
                assert n.scalar_one() == 2
        finally:
            engine.dispose()


async def test_namespaces_read_their_own_schemas_then_the_unscoped_ones(backend: Backend) -> None:
    store = backend.store
    await store.put_workflow_schemas({("wf", "1"): {"who": "unscoped"}})
    a, b = store.scoped("a"), store.scoped("b")
    await a.put_workflow_schemas({("wf", "1"): {"who": "a"}})
    assert await a.workflow_schema("wf", "1") == {"who": "a"}
    assert await b.workflow_schema("wf", "1") == {"who": "unscoped"}
    assert await store.workflow_schema("wf", "1") == {"who": "unscoped"}


def test_sql_table_is_created_on_an_existing_database(tmp_path: Path) -> None:
    """A database an older flowkit created (no ``flowkit_workflow_schemas``) gets the table on
    first use, without a new schema version."""
    url = f"sqlite:///{tmp_path / 'old.db'}"

    async def use() -> Any:
        store = SqlStore(url)
        try:
            await store.put_workflow_schemas({("wf", "1"): {"format": 1}})
            return await store.workflow_schema("wf", "1")
        finally:
            store.close()

    assert asyncio.run(use()) == {"format": 1}
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE flowkit_workflow_schemas"))
    engine.dispose()
    assert asyncio.run(use()) == {"format": 1}


# -- the command line, without the code --------------------------------------------------
@pytest.fixture
def waiting(tmp_path: Path) -> tuple[str, str]:
    """A SQLite file with run ``o7`` of ``order`` past its update (answered), and no worker
    running: what a signal writes stays to be seen."""
    url = f"sqlite:///{tmp_path / 'f.db'}"

    async def park() -> None:
        store = SqlStore(url)
        try:
            async with Engine(store, [Order()], poll_interval=0.05) as engine:
                await engine.start("order", {"sku": "B-2", "qty": 3}, "o7")
                await engine.update("o7", "change_address", {"street": "Z"}, timeout=30)
        finally:
            store.close()

    asyncio.run(park())
    return url, "o7"


def _events(url: str, run_id: str) -> tuple[int, list[str]]:
    async def read() -> tuple[int, list[str]]:
        store = SqlStore(url)
        try:
            held = [n for n in ("shipped", "shiped") if await store.peek_signal(run_id, n)]
            return len(await store.load_events(run_id)), held
        finally:
            store.close()

    return asyncio.run(read())


def test_flowkit_signal_validates_without_the_code(
    tmp_path: Path, waiting: tuple[str, str]
) -> None:
    url, run_id = waiting
    before = _events(url, run_id)
    bad = flowkit(tmp_path, "--db", url, "signal", run_id, "shipped", '{"carrier": 7}')
    assert bad.returncode == 2 and bad.stdout == "", bad
    assert bad.stderr.startswith(
        "flowkit: error: invalid input for workflow 'order': payload of signal 'shipped'"
    )
    assert len(bad.stderr.splitlines()) == 1, bad.stderr
    typo = flowkit(tmp_path, "--db", url, "signal", run_id, "shiped", '{"carrier": "x"}')
    assert typo.returncode == 2 and typo.stderr == (
        "flowkit: error: invalid input for workflow 'order': version '1' declares no signal "
        "'shiped' (its signals: 'note', 'shipped')\n"
    )
    reserved = flowkit(tmp_path, "--db", url, "signal", run_id, "flowkit:x")
    assert reserved.returncode == 2 and "reserved" in reserved.stderr
    assert _events(url, run_id) == before == (before[0], [])
    ok = flowkit(
        tmp_path, "--db", url, "signal", run_id, "shipped", '{"carrier": "ups", "tracking": 5}'
    )
    assert ok.returncode == 0, ok.stderr

    async def finish() -> Any:
        store = SqlStore(url)
        try:
            async with Engine(store, [Order()], poll_interval=0.05) as engine:
                return await engine.result(run_id, timeout=30)
        finally:
            store.close()

    assert asyncio.run(finish()) == "3 x B-2 to Z by ups"


# -- the dashboard, without the code -----------------------------------------------------
async def test_dashboard_signal_and_retry_are_checked_without_the_code(store: Any) -> None:
    """The dashboard (no ``--app``) refuses a signal or a retry input its run's recorded
    schema refuses: an error flash, nothing written; a good one goes through."""
    async with Engine(store, [Order(), Halver()], poll_interval=0.05) as engine:
        await engine.start("order", {"sku": "C-3", "qty": 1}, "o8")
        await engine.update("o8", "change_address", {"street": "W"}, timeout=30)
        await engine.start("halver", 5, "h8")
        with pytest.raises(WorkflowFailedError):
            await engine.result("h8", timeout=30)
    frozen = {rid: len(await store.load_events(rid)) for rid in ("o8", "h8")}
    async with ui_kit.client(store) as c:
        for run_id, action, form, says in (
            (
                "o8",
                "signal",
                {"name": "shipped", "payload": '{"carrier": 1, "tracking": 2}'},
                "carrier",
            ),
            ("o8", "signal", {"name": "shiped", "payload": "{}"}, "declares no signal"),
            ("h8", "retry", {"input": '"six"'}, "'six' is not of type 'integer'"),
        ):
            kind, text, _ = await _ui_post(c, run_id, action, **form)
            assert kind == "error" and says in text, text
        assert {rid: len(await store.load_events(rid)) for rid in frozen} == frozen
        assert await store.peek_signal("o8", "shipped") is None
        kind, text, _ = await _ui_post(c, "h8", "retry", input="6")
        assert kind == "ok", text
    assert (await store.get_run("h8")).status is RunStatus.PENDING
