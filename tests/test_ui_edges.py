"""The dashboard at its edges: a lane whose workflow name holds ``/``, JSON nested too deeply
for the parser, a ``before`` that is not a finite time, two dashboards on one host (cookies
ignore ports), retry with a new input (only with the workflow's code, ``--app``), the printed
URL of an IPv6 host, and live updates that survive a failing store read and stop reading the
store once the last browser left."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel
from ui_kit import TOKEN, WORKFLOWS, client, csrf_of, parse, seed, until

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.cli._ui_command import _url
from flowkit.cli.ui._sse import Changes
from flowkit.stores import MemoryStore


@workflow(name="team/a", singleton=Singleton(key=lambda inp: "k/1"))
class Slashed:
    async def run(self, ctx: WorkflowCtx, inp: int) -> int:
        return inp


async def test_the_lane_of_a_workflow_named_with_a_slash(store: Any) -> None:
    engine = Engine(store, [Slashed], worker=False)
    for i in range(2):
        await engine.start("team/a", i, f"slash-{i}")
    async with client(store) as c:
        lanes = parse((await c.get("/lanes")).text)
        link = lanes.all("a", "lane-link")[0].get("href")
        assert link == "/lanes/team%2Fa/k%2F1"
        page = parse((await c.get(link)).text)
        lane = page.by_id("lane")
        assert lane is not None
        assert (lane.get("data-workflow"), lane.get("data-key")) == ("team/a", "k/1")
        members = page.all("li", "lane-member")
        assert [m.get("data-run-id") for m in members] == ["slash-0", "slash-1"]


async def test_json_nested_too_deeply_is_an_error_flash(store: Any) -> None:
    await seed(store)
    before = {rid: await store.get_run(rid) for rid in ("holder", "failed")}
    async with client(store) as c:
        csrf = csrf_of((await c.get("/runs/holder")).text)
        deep = "[" * 100_000 + "]" * 100_000
        for run_id, action, field in (
            ("holder", "signal", "payload"),
            ("failed", "retry", "input"),
        ):
            r = await c.post(
                f"/runs/{run_id}/{action}", data={"csrf": csrf, "name": "go", field: deep}
            )
            assert r.status_code == 303, r.text
            flash = parse((await c.get(f"/runs/{run_id}")).text).by_id("flash")
            assert flash is not None and flash.get("data-kind") == "error"
            assert "nested too deeply" in flash.text
    assert await store.peek_signal("holder", "go") is None
    for run_id, run in before.items():
        assert (await store.get_run(run_id)) == run


@pytest.mark.parametrize("before", ["nan:x", "inf:x", "-inf:x"])
async def test_a_before_that_is_not_a_finite_time_is_a_filter_error(
    store: Any, before: str
) -> None:
    await seed(store)
    async with client(store) as c:
        r = await c.get("/runs", params={"before": before})
        assert r.status_code == 400
        assert parse(r.text).by_id("filter-error") is not None


async def test_two_dashboards_on_one_host_keep_their_own_logins() -> None:
    """Cookies ignore ports: each dashboard's login cookie is named by its port."""
    store = MemoryStore()
    async with client(store, base="http://127.0.0.1:8233", login=False) as a:
        r = await a.get(f"/runs?token={TOKEN}")
        assert r.headers["set-cookie"].startswith("flowkit_ui_8233=")
        assert (await a.get("/runs")).status_code == 200
    async with client(store, base="http://127.0.0.1:8234", login=False) as b:
        r = await b.get(f"/runs?token={TOKEN}")
        assert r.headers["set-cookie"].startswith("flowkit_ui_8234=")
        b.cookies.set("flowkit_ui_8233", r.headers["set-cookie"].split(";")[0].split("=", 1)[1])
        b.cookies.delete("flowkit_ui_8234")
        assert (await b.get("/runs")).status_code == 401  # (the other port's cookie: no)


class Order(BaseModel):
    sku: str
    qty: int


@workflow(name="typed-fails")
class TypedFails:
    async def run(self, ctx: WorkflowCtx, order: Order) -> str:
        if order.qty < 1:
            raise ValueError("nothing to ship")
        return f"{order.qty} x {order.sku}"


async def test_retry_with_a_new_input_is_checked_by_the_code_or_the_recorded_schema(
    store: Any,
) -> None:
    async with Engine(store, [TypedFails], poll_interval=0.05) as engine:
        await engine.start(TypedFails, {"sku": "a", "qty": 0}, "typed")
        with pytest.raises(Exception, match="nothing to ship"):
            await engine.result("typed", timeout=20)
    frozen = await store.get_run("typed")
    async with client(store) as c:  # (no --app: the input schema its worker recorded checks it)
        html = (await c.get("/runs/typed")).text
        assert parse(html).all("textarea", name="input")
        assert parse(html).by_id("retry-same-input") is None
        r = await c.post("/runs/typed/retry", data={"csrf": csrf_of(html), "input": '{"sku": 1}'})
        flash = parse((await c.get(r.headers["location"])).text).by_id("flash")
        assert flash is not None and flash.get("data-kind") == "error"
        assert await store.get_run("typed") == frozen  # (refused: nothing written)
    async with client(store, workflows=[TypedFails]) as c:  # (--app: the input is checked)
        html = (await c.get("/runs/typed")).text
        assert parse(html).all("textarea", name="input")
        csrf = csrf_of(html)
        r = await c.post("/runs/typed/retry", data={"csrf": csrf, "input": '{"sku": "a"}'})
        flash = parse((await c.get(r.headers["location"])).text).by_id("flash")
        assert flash is not None and flash.get("data-kind") == "error"
        assert await store.get_run("typed") == frozen  # (refused: nothing written)
        new = '{"sku": "a", "qty": 2}'
        r = await c.post("/runs/typed/retry", data={"csrf": csrf, "input": new})
        flash = parse((await c.get(r.headers["location"])).text).by_id("flash")
        assert flash is not None and flash.get("data-kind") == "ok", flash.text
    async with Engine(store, [TypedFails], poll_interval=0.05) as engine:
        assert await engine.result("typed", timeout=20) == "2 x a"


def test_the_printed_url_of_each_host() -> None:
    assert _url("::1", 8233, "T") == "http://[::1]:8233/?token=T"
    assert _url("[::1]", 8233, "T") == "http://[::1]:8233/?token=T"
    assert _url("127.0.0.1", 1, None) == "http://127.0.0.1:1/"


class _Flaky:
    """A store whose change stamp fails ``fails`` times (a database blip), then works."""

    def __init__(self, inner: Any, fails: int) -> None:
        self._inner = inner
        self.fails = fails
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def change_stamp(self) -> object:
        self.reads += 1
        if self.fails > 0:
            self.fails -= 1
            raise ConnectionError("database blip")
        return await self._inner.change_stamp()


async def _never() -> bool:
    return False


async def test_live_updates_survive_a_failing_store_read_and_stop_when_nobody_listens() -> None:
    inner = MemoryStore()
    flaky = _Flaky(inner, fails=3)
    changes = Changes(flaky, interval=0.01, keepalive=60)
    stream = changes.stream(_never)
    assert (await asyncio.wait_for(anext(stream), 10)).endswith(": connected\n\n")

    async def read_again() -> bool:  # (the blips, then one read that worked)
        return flaky.reads > 3

    await until(read_again, "a read after the blips")
    await Engine(inner, WORKFLOWS, worker=False).start("echo", 1, "after-the-blip")
    assert await asyncio.wait_for(anext(stream), 10) == "event: change\ndata: {}\n\n"
    await stream.aclose()  # (the last browser leaves)

    async def stopped() -> bool:
        return changes._stop is None

    await until(stopped, "the watcher to stop")
    reads = flaky.reads
    await asyncio.sleep(0.1)
    assert flaky.reads == reads
    await changes.close()
