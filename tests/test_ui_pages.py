"""The dashboard's pages over HTTP (``flowkit.cli.ui.create_app``, DOM of docs/ui.md) on each store:
runs newest first with counts and filters, keyset paging, a run with its payloads, timeline,
lane, parent and children, the lanes, 404s, and markup from the store always escaped."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from ui_kit import SEEDED, XSS, El, client, parse, seed, until

from flowkit import Engine, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.errors import SingletonQueueFullError


async def _page(store: Any, url: str, status: int = 200) -> El:
    async with client(store) as c:
        r = await c.get(url)
    assert r.status_code == status, (url, r.status_code, r.text[:500])
    return parse(r.text)


def _rows(doc: El) -> list[El]:
    table = doc.by_id("runs")
    return [] if table is None else table.all("tr", "run")


async def test_runs_page_newest_first_with_counts(store: Any) -> None:
    await seed(store)
    runs = await store.list_runs()
    doc = await _page(store, "/runs")
    body = doc.one("body")
    assert body.get("data-page") == "runs" and body.get("data-read-only") == "false"
    assert doc.by_id("nav-runs").get("href") == "/runs"  # type: ignore[union-attr]
    assert doc.by_id("nav-lanes").get("href") == "/lanes"  # type: ignore[union-attr]
    assert doc.by_id("live-status").get("data-state") == "connecting"  # type: ignore[union-attr]
    assert doc.by_id("flash") is None
    live = doc.by_id("runs-live")
    assert live is not None and "data-live" in live.attrs
    rows = _rows(doc)
    newest = sorted(runs, key=lambda r: (r.created_at, r.id), reverse=True)
    assert [r.get("data-run-id") for r in rows] == [r.id for r in newest]
    by_id = {r.id: r for r in runs}
    for row in rows:
        run = by_id[row.get("data-run-id") or ""]
        assert row.get("data-status") == run.status
        link = row.one("td", "id").one("a", "run-link")
        assert link.get("href") == f"/runs/{quote(run.id, safe='')}" and link.text == run.id
        assert row.one("td", "workflow").text == run.workflow
        assert row.one("td", "status").one("span", "badge").classes >= {f"status-{run.status}"}
        assert row.one("td", "key").text == (run.singleton_key or "")
        for cell in ("created", "updated"):
            t = row.one("td", cell).one("time")
            assert (t.get("datetime") or "").endswith("Z") and float(t.get("data-ts") or 0) > 0
            assert t.get("title") == t.get("datetime")
            assert t.text.endswith(" ago") or t.text == "just now"
    counts = doc.by_id("counts")
    assert counts is not None
    for s in RunStatus:
        a = counts.one("a", "count", data_status=str(s))
        assert a.one("span", "n").text == str(sum(r.status == s for r in runs)), s
        assert f"status={s}" in (a.get("href") or "")
    assert doc.by_id("count-total").one("span", "n").text == str(len(SEEDED) + 1)  # type: ignore[union-attr]
    assert doc.by_id("runs-empty") is None and doc.by_id("next-page") is None
    assert doc.by_id("first-page") is None
    form = doc.by_id("filters")
    assert form is not None and form.get("method") == "get"
    for name in ("workflow", "tag", "search"):
        form.one("input", name=name)
    assert form.one("select", name="status").all("option")[0].get("value") == ""
    assert doc.by_id("apply-filters") is not None
    assert doc.by_id("clear-filters").get("href") == "/runs"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("workflow=lane", ["waiter-2", "waiter-1", "holder"]),
        ("status=failed", ["failed"]),
        ("workflow=lane&status=suspended", None),  # (the lane's runs that wait: checked below)
        ("tag=billing", ["tagged"]),
        ("search=" + quote(f"customer={XSS}"), ["tagged"]),
        ("search=" + quote("amount>=100, amount<200"), ["tagged"]),
        ("search=" + quote("amount>=500"), []),
        ("workflow=nothing-like-it", []),
    ],
)
async def test_filters_and_their_counts(store: Any, query: str, expected: list[str] | None) -> None:
    await seed(store)
    doc = await _page(store, f"/runs?{query}")
    got = [r.get("data-run-id") for r in _rows(doc)]
    if expected is None:
        lane = [r for r in await store.list_runs(workflow="lane") if r.status == "suspended"]
        expected = [r.id for r in sorted(lane, key=lambda r: (r.created_at, r.id), reverse=True)]
    assert got == expected
    if not expected:
        empty = doc.by_id("runs-empty")
        assert empty is not None and "No runs match" in empty.text
    total = doc.by_id("count-total").one("span", "n").text  # type: ignore[union-attr]
    if "status=" not in query:
        assert total == str(len(expected))  # (the counts follow workflow, tag and search)
    form = doc.by_id("filters")
    assert form is not None
    if query.startswith("workflow="):
        value = query.split("&")[0].partition("=")[2]
        assert form.one("input", name="workflow").get("value") == value


@pytest.mark.parametrize(
    "query",
    [
        "search=" + quote("no operator"),
        "search=" + quote(f"{XSS}=1"),
        "status=" + quote(XSS),
        "before=nonsense",
        "limit=0",
        "limit=" + quote(XSS),
    ],
)
async def test_a_bad_filter_is_an_error_message_not_a_crash(store: Any, query: str) -> None:
    await seed(store)
    async with client(store) as c:
        r = await c.get(f"/runs?{query}")
    assert r.status_code == 400
    assert XSS not in r.text
    doc = parse(r.text)
    err = doc.by_id("filter-error")
    assert err is not None and err.get("data-kind") == "error" and err.text.strip()
    assert doc.by_id("runs-empty") is not None


async def test_keyset_paging_newest_first(store: Any) -> None:
    await seed(store)
    everything = sorted(await store.list_runs(), key=lambda r: (r.created_at, r.id), reverse=True)
    seen: list[str] = []
    url = "/runs?limit=3"
    pages = 0
    async with client(store) as c:
        while url:
            r = await c.get(url)
            assert r.status_code == 200
            doc = parse(r.text)
            rows = [row.get("data-run-id") or "" for row in _rows(doc)]
            assert 1 <= len(rows) <= 3
            seen += rows
            assert (doc.by_id("first-page") is not None) == (pages > 0)
            nxt = doc.by_id("next-page")
            url = "" if nxt is None else nxt.get("href") or ""
            assert url == "" or ("before=" in url and "limit=3" in url)
            pages += 1
    assert seen == [r.id for r in everything]
    assert pages == 3


async def test_run_page_of_a_lane_holder_and_waiter(store: Any) -> None:
    await seed(store)
    for current, role, position in (("holder", "holder", "0"), ("waiter-1", "waiter", "1")):
        doc = await _page(store, f"/runs/{current}")
        assert doc.one("body").get("data-page") == "run"
        live = doc.by_id("run-live")
        assert live is not None and "data-run-live" in live.attrs
        assert (live.get("data-stream") or "").startswith(f"/events?run={current}&after=")
        assert doc.by_id("run-id").text == current  # type: ignore[union-attr]
        assert "mono" in doc.by_id("run-id").classes  # type: ignore[union-attr]
        badge = doc.by_id("run-status")
        assert badge is not None and "badge" in badge.classes
        assert badge.get("data-status") == "suspended" and "status-suspended" in badge.classes
        assert doc.by_id("run-workflow").text == "lane"  # type: ignore[union-attr]
        assert doc.by_id("run-version").text == "1"  # type: ignore[union-attr]
        assert doc.by_id("run-attempt").text == "1"  # type: ignore[union-attr]
        assert doc.by_id("run-key").text == XSS  # type: ignore[union-attr]
        assert doc.by_id("run-lease").text == "—"  # type: ignore[union-attr]
        for t in ("run-created", "run-updated"):
            assert doc.by_id(t).one("time").get("data-ts")  # type: ignore[union-attr]
        lane = doc.by_id("lane")
        assert lane is not None
        assert lane.get("data-workflow") == "lane" and lane.get("data-key") == XSS
        members = doc.by_id("lane-members").all("li", "lane-member")  # type: ignore[union-attr]
        assert [
            (m.get("data-run-id"), m.get("data-role"), m.get("data-position")) for m in members
        ] == [
            ("holder", "holder", "0"),
            ("waiter-1", "waiter", "1"),
            ("waiter-2", "waiter", "2"),
        ]
        mine = [m for m in members if "current" in m.classes]
        assert [(m.get("data-role"), m.get("data-position")) for m in mine] == [(role, position)]
        assert doc.by_id("lane-depth").text == "2"  # type: ignore[union-attr]
        assert doc.by_id("lane-none") is None
        types = [e.get("data-type") for e in doc.by_id("timeline").all("li", "event")]  # type: ignore[union-attr]
        assert types[0] == "run_started"
        assert ("singleton_admitted" in types) == (current == "holder")
        assert ("singleton_gated" in types) == (current != "holder")
        actions = doc.by_id("actions")
        assert actions is not None and actions.parent is not None
        assert actions.parent.get("id") == "actions-live"  # (apart from the state)
        for form, button in (("cancel-form", "cancel-button"), ("signal-form", "signal-button")):
            f = doc.by_id(form)
            assert f is not None and f.get("method") == "post" and f.get("data-confirm")
            assert f.get("action") == f"/runs/{current}/{form.split('-')[0]}"
            assert f.by_id(button) is not None
            assert f.one("input", name="csrf").get("value")
        assert doc.by_id("retry-form") is None  # (a suspended run: nothing to retry)
        doc.by_id("signal-form").one("input", name="name")  # type: ignore[union-attr]
        doc.by_id("signal-form").one("textarea", name="payload")  # type: ignore[union-attr]


async def test_run_page_of_a_failed_run(store: Any) -> None:
    await seed(store)
    doc = await _page(store, "/runs/failed")
    assert doc.by_id("run-status").get("data-status") == "failed"  # type: ignore[union-attr]
    error = doc.by_id("run-error").one("pre").text  # type: ignore[union-attr]
    assert "ValueError" in error and f"bad row: {XSS}" in error
    assert doc.by_id("run-input").one("pre").text == f'"{XSS}"'  # type: ignore[union-attr]
    assert doc.by_id("run-output").one("pre").text == "—"  # type: ignore[union-attr]
    assert doc.by_id("lane-none") is not None and doc.by_id("lane") is None
    events = doc.by_id("timeline").all("li", "event")  # type: ignore[union-attr]
    assert [e.get("data-type") for e in events][-1] == "run_failed"
    assert [e.get("data-seq") for e in events] == [str(i) for i in range(1, len(events) + 1)]
    assert events[0].one("span", "event-at").text == "+0.000s"
    for e in events:
        assert e.one("span", "event-type").text == e.get("data-type")
        assert e.one("span", "event-at").text.startswith("+")
    for e in events:  # (its time as a <time> app.js shows in local time; UTC until then)
        t = e.one("time", "event-time")
        assert t.get("data-format") == "local" and float(t.get("data-ts") or 0) > 0
        assert (t.get("datetime") or "").endswith("Z") and t.text == t.get("datetime")
    # the fields read as fields: the error by its headline (its JSON under "details")
    err = events[-1].one("dd", data_field="error")
    assert "field-error" in err.classes
    assert err.one("span", "error-line").text == f"ValueError: bad row: {XSS}"
    assert '"message"' in err.one("pre").text
    started = events[0]
    assert started.one("dd", data_field="workflow").text == "fails"
    assert started.one("dd", data_field="input").text == f"{XSS}"  # (a string: as it is)
    assert not started.all("dd", data_field="args_digest")


async def test_run_page_of_a_parent_its_child_tags_and_search(store: Any) -> None:
    await seed(store)
    parent = await _page(store, "/runs/parent")
    children = parent.by_id("run-children").all("a")  # type: ignore[union-attr]
    (kids,) = [await store.list_runs(parent_id="parent")]
    assert [a.text for a in children] == [k.id for k in kids] and len(kids) == 1
    assert children[0].get("href") == f"/runs/{quote(kids[0].id, safe='')}"
    assert parent.by_id("run-parent").text.strip() == "—"  # type: ignore[union-attr]
    child = await _page(store, children[0].get("href") or "")
    a = child.by_id("run-parent").one("a")  # type: ignore[union-attr]
    assert a.get("href") == "/runs/parent" and a.text == "parent"
    assert child.by_id("run-output").one("pre").text.replace(" ", "").replace("\n", "") == '{"n":1}'  # type: ignore[union-attr]

    tagged = await _page(store, "/runs/tagged")
    tags = [li.text for li in tagged.by_id("run-tags").all("li", "tag")]  # type: ignore[union-attr]
    assert tags == [XSS, "billing"]
    search = tagged.by_id("run-search").text  # type: ignore[union-attr]
    assert "customer" in search and "amount" in search and "120" in search
    assert f'"{XSS}"' in search
    assert XSS in tagged.by_id("run-output").one("pre").text  # type: ignore[union-attr]


async def test_lanes_and_one_lane(store: Any) -> None:
    await seed(store)
    doc = await _page(store, "/lanes")
    assert doc.one("body").get("data-page") == "lanes"
    live = doc.by_id("lanes-live")
    assert live is not None and "data-live" in live.attrs
    (row,) = doc.by_id("lanes").all("tr", "lane")  # type: ignore[union-attr]
    assert row.get("data-workflow") == "lane" and row.get("data-key") == XSS
    assert row.one("td", "workflow").text == "lane"
    link = row.one("td", "key").one("a", "lane-link")
    assert link.text == XSS and link.get("href") == f"/lanes/lane/{quote(XSS, safe='')}"
    assert row.one("td", "holders").text == "1" and row.one("td", "depth").text == "2"
    waiter = await store.get_run("waiter-1")
    oldest = row.one("td", "oldest-wait").one("time")
    assert float(oldest.get("data-ts") or 0) == pytest.approx(waiter.created_at)
    assert doc.by_id("lanes-empty") is None

    lane = await _page(store, link.get("href") or "")
    members = lane.by_id("lane-members").all("li", "lane-member")  # type: ignore[union-attr]
    assert [m.get("data-run-id") for m in members] == ["holder", "waiter-1", "waiter-2"]
    assert [m.get("data-position") for m in members] == ["0", "1", "2"]
    assert not any("current" in m.classes for m in members)
    assert lane.by_id("lane-depth").text == "2"  # type: ignore[union-attr]


async def test_empty_store_shows_empty_states(store: Any) -> None:
    runs = await _page(store, "/runs")
    assert "No runs match" in runs.by_id("runs-empty").text  # type: ignore[union-attr]
    assert runs.by_id("runs") is None
    assert all(n.text == "0" for n in runs.by_id("counts").all("span", "n"))  # type: ignore[union-attr]
    lanes = await _page(store, "/lanes")
    assert "No singleton lanes have active runs" in lanes.by_id("lanes-empty").text  # type: ignore[union-attr]
    assert lanes.by_id("lanes") is None


async def test_unknown_run_is_a_404_page(store: Any) -> None:
    await seed(store)
    for rid in ("nope", quote(XSS, safe="")):
        async with client(store) as c:
            r = await c.get(f"/runs/{rid}")
        assert r.status_code == 404
        assert XSS not in r.text
        assert parse(r.text).by_id("not-found") is not None


async def test_markup_from_the_store_is_always_escaped(store: Any) -> None:
    await seed(store)
    urls = ["/runs", "/lanes", f"/lanes/lane/{quote(XSS, safe='')}", f"/runs?tag={quote(XSS)}"]
    urls += [f"/runs/{quote(r.id, safe='')}" for r in await store.list_runs()]
    urls += [f"/runs?workflow={quote(XSS)}", f"/runs?search={quote('customer=' + XSS)}"]
    async with client(store) as c:
        for url in urls:
            r = await c.get(url)
            assert r.status_code == 200, url
            assert XSS not in r.text and "<script>alert" not in r.text, url
            assert r.text.count("<script") == 1, url  # (only /static/app.js)
    # the markup is there, as text: the workflow named with it, the signal it waits for
    markup = await _page(store, "/runs/markup")
    assert markup.by_id("run-workflow").text == XSS  # type: ignore[union-attr]
    assert XSS in markup.by_id("run-waiting").text  # type: ignore[union-attr]
    runs = await _page(store, f"/runs?workflow={quote(XSS)}")
    assert [r.get("data-run-id") for r in _rows(runs)] == ["markup"]


async def test_the_counts_stop_at_the_count_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs page counts at most ``COUNT_LIMIT`` runs per status (the store's work is
    bounded by it): a status with more shows ``<limit>+``, and so does the total."""
    from flowkit.cli.ui import _views
    from flowkit.stores import MemoryStore

    store = MemoryStore()
    await seed(store)
    runs = await store.list_runs()
    monkeypatch.setattr(_views, "COUNT_LIMIT", 1)
    doc = await _page(store, "/runs")
    counts = doc.by_id("counts")
    assert counts is not None
    real = {s: sum(r.status == s for r in runs) for s in RunStatus}
    assert any(n > 1 for n in real.values())
    for s, n in real.items():
        shown = counts.one("a", "count", data_status=str(s)).one("span", "n").text
        assert shown == ("1+" if n > 1 else str(n)), s
    total = doc.by_id("count-total").one("span", "n").text  # type: ignore[union-attr]
    assert total == f"{sum(min(n, 1) for n in real.values())}+"


@workflow(name="capped", singleton=Singleton(key=lambda inp: "k", limit=1, max_queue_depth=1))
class Capped:
    """One slot, one more may wait: two runs fill the key."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        return await ctx.wait_for_signal("go")


async def test_a_lanes_limit_and_full_queue(store: Any) -> None:
    async with Engine(store, [Capped()], poll_interval=0.05) as engine:
        await engine.start("capped", 1, "c-1")
        await engine.start("capped", 2, "c-2")
        with pytest.raises(SingletonQueueFullError):
            await engine.start("capped", 3, "c-3")

        async def rested() -> bool:
            return bool((await store.get_run("c-1")).waiting_signals)

        await until(rested, "the holder to wait")
    # with the workflow's code (``--app``): the limit, the cap, and the queue full
    async with client(store, workflows=[Capped()]) as c:
        lanes = parse((await c.get("/lanes")).text)
        (row,) = lanes.by_id("lanes").all("tr", "lane")  # type: ignore[union-attr]
        assert row.get("data-full") == "true"
        assert row.one("td", "limit").text == "1" and row.one("td", "cap").text == "1"
        assert "full" in row.one("td", "depth").text
        for url in ("/runs/c-2", "/lanes/capped/k"):
            doc = parse((await c.get(url)).text)
            assert doc.by_id("lane").get("data-full") == "true", url  # type: ignore[union-attr]
            assert doc.by_id("lane-limit").text == "1" and doc.by_id("lane-cap").text == "1"  # type: ignore[union-attr]
            assert doc.by_id("lane-full") is not None, url
    # without it, from what the worker recorded in the store (its workflow schemas)
    async with client(store) as c:
        lanes = parse((await c.get("/lanes")).text)
        (row,) = lanes.by_id("lanes").all("tr", "lane")  # type: ignore[union-attr]
        assert row.get("data-full") == "true" and row.one("td", "limit").text == "1"
        for url in ("/runs/c-2", "/lanes/capped/k"):
            doc = parse((await c.get(url)).text)
            assert doc.by_id("lane-limit").text == "1" and doc.by_id("lane-cap").text == "1"  # type: ignore[union-attr]
            assert doc.by_id("lane-full") is not None, url
    # a worker that recorded no limits (an older flowkit's document): the dashboard says so
    doc_v1 = dict(await store.workflow_schema("capped", "1"))
    del doc_v1["singleton"]
    await store.put_workflow_schemas({("capped", "1"): doc_v1})
    async with client(store) as c:
        lanes = parse((await c.get("/lanes")).text)
        (row,) = lanes.by_id("lanes").all("tr", "lane")  # type: ignore[union-attr]
        assert row.get("data-full") == "false" and row.one("td", "limit").text == "?"
        doc = parse((await c.get("/runs/c-2")).text)
        assert doc.by_id("lane-limit") is None and doc.by_id("lane-full") is None
        assert "--app" in doc.by_id("lane-limits").text  # type: ignore[union-attr]


@workflow(name="publisher")
class Publisher:
    """Publishes two keys (one twice), then waits."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        await ctx.set_event("progress", {"done": 1})
        await ctx.set_event("stage", XSS)
        await ctx.set_event("progress", {"done": 2})
        return await ctx.wait_for_signal("go")


async def test_a_run_shows_its_published_values(store: Any) -> None:
    async with Engine(store, [Publisher()], poll_interval=0.05) as engine:
        await engine.start("publisher", None, "pub", search={"customer": "c-9"})

        async def rested() -> bool:
            return bool((await store.get_run("pub")).waiting_signals)

        await until(rested, "the publisher to wait")
    doc = await _page(store, "/runs/pub")
    published = doc.by_id("run-published")
    assert published is not None
    keys = [dt.get("data-key") for dt in published.all("dt")]
    assert keys == ["progress", "stage"]  # (the latest of each key, newest first)
    values = [dd.one("pre").text for dd in published.all("dd")]
    assert json.loads(values[0]) == {"done": 2} and json.loads(values[1]) == XSS
    assert doc.by_id("run-version").text == "1"  # type: ignore[union-attr]
    assert "c-9" in doc.by_id("run-search").text  # type: ignore[union-attr]
    empty = await _page(store, "/runs/pub?before=1")  # (another page of the timeline: the same)
    assert [dt.get("data-key") for dt in empty.by_id("run-published").all("dt")] == keys  # type: ignore[union-attr]
