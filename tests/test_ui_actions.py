"""The dashboard's actions over HTTP (docs/ui.md "Actions"): cancel, retry, signal with a JSON
payload, each answered by a redirect to the run with a flash; a bad payload, a run in the wrong
state or an input its workflow's recorded schema refuses is an error flash and writes
nothing."""

from __future__ import annotations

from typing import Any

import httpx
from ui_kit import WORKFLOWS, XSS, client, csrf_of, parse, seed, status_of, until

from flowkit import Engine


async def _post(c: httpx.AsyncClient, run_id: str, action: str, **fields: str) -> Any:
    """Post an action form as a browser would (the CSRF value read off the run's page), follow
    the redirect; the run page after it, parsed."""
    csrf = csrf_of((await c.get(f"/runs/{run_id}")).text)
    r = await c.post(f"/runs/{run_id}/{action}", data={"csrf": csrf, **fields})
    assert r.status_code == 303, r.text
    assert r.headers["location"] == f"/runs/{run_id}"
    page = await c.get(r.headers["location"])
    assert page.status_code == 200
    assert XSS not in page.text
    doc = parse(page.text)
    flash = doc.by_id("flash")
    assert flash is not None
    again = await c.get(r.headers["location"])  # (a flash shows once)
    assert parse(again.text).by_id("flash") is None
    return flash.get("data-kind"), flash.text.strip(), doc


async def _frozen(store: Any, run_id: str) -> tuple[Any, ...]:
    run = await store.get_run(run_id)
    return (run.status, run.attempt, run.input, len(await store.load_events(run_id)))


async def test_cancel(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        kind, text, doc = await _post(c, "waiter-2", "cancel")
    assert kind == "ok" and text == "cancelled: the run is cancelled"
    assert await status_of(store, "waiter-2") == "cancelled"  # (never admitted: at once)
    assert doc.by_id("run-status").get("data-status") == "cancelled"


async def test_cancel_of_a_settled_run_changes_nothing(store: Any) -> None:
    await seed(store)
    before = await _frozen(store, "tagged")
    async with client(store) as c:
        kind, text, _ = await _post(c, "tagged", "cancel")
    assert kind == "ok" and "already completed" in text
    assert await _frozen(store, "tagged") == before


async def test_retry_of_a_failed_run(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        kind, text, doc = await _post(c, "failed", "retry")
    assert kind == "ok" and "attempt 2" in text
    run = await store.get_run("failed")
    assert run.status == "pending" and run.attempt == 2
    types = [e.get("data-type") for e in doc.by_id("timeline").all("li", "event")]
    assert types[-1] == "run_retried"
    assert doc.by_id("run-attempt").text == "2"


async def test_retry_refusals_write_nothing(store: Any) -> None:
    await seed(store)
    before = await _frozen(store, "failed")
    completed = await _frozen(store, "tagged")
    async with client(store) as c:
        kind, text, _ = await _post(c, "failed", "retry", input="{not json")
        assert kind == "error" and "not valid JSON" in text
        # (a new input is checked by the schema the run's worker recorded: tests/test_messages.py)
        kind, text, _ = await _post(c, "tagged", "retry")
        assert kind == "error" and "completed" in text
    assert await _frozen(store, "failed") == before
    assert await _frozen(store, "tagged") == completed


async def test_signal_reaches_the_inbox_and_wakes_the_run(store: Any) -> None:
    await seed(store)
    payload = {"by": XSS, "n": [1, 2.5, None]}
    async with client(store) as c:
        kind, text, _ = await _post(
            c,
            "holder",
            "signal",
            name="go",
            payload='{"by": "<script>alert(1)</script>", "n": [1, 2.5, null]}',
        )
    assert kind == "ok" and "'go'" in text
    inbox = await store.peek_signal("holder", "go")
    assert inbox is not None and inbox.payload == payload
    async with Engine(store, WORKFLOWS, poll_interval=0.05) as engine:
        assert await engine.result("holder", timeout=20) == payload

        async def admitted() -> bool:  # (the lane moves on: the first waiter holds it now)
            return (await store.get_run("waiter-1")).admitted

        await until(admitted, "waiter-1 to hold the lane")


async def test_signal_named_with_markup_and_without_payload(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        kind, text, _ = await _post(c, "markup", "signal", name=XSS, payload="")
    assert kind == "ok" and XSS in text  # (shown as text: escaped in the page, checked above)
    inbox = await store.peek_signal("markup", XSS)
    assert inbox is not None and inbox.payload is None


async def test_signal_refusals_write_nothing(store: Any) -> None:
    await seed(store)
    holder = await _frozen(store, "holder")
    tagged = await _frozen(store, "tagged")
    async with client(store) as c:
        kind, text, _ = await _post(c, "holder", "signal", name="go", payload="{bad")
        assert kind == "error" and "payload is not valid JSON" in text
        kind, text, _ = await _post(c, "holder", "signal", name="  ", payload="1")
        assert kind == "error" and "name" in text
        kind, text, _ = await _post(c, "holder", "signal", name="flowkit:update:x", payload="1")
        assert kind == "error"
        kind, text, _ = await _post(c, "tagged", "signal", name=XSS, payload="1")
        assert kind == "error" and "completed" in text and XSS in text
    assert await store.peek_signal("holder", "go") is None
    assert await _frozen(store, "holder") == holder
    assert await _frozen(store, "tagged") == tagged


async def test_action_on_an_unknown_run_is_404(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        csrf = csrf_of((await c.get("/runs/holder")).text)
        for action in ("cancel", "retry", "signal"):
            r = await c.post(f"/runs/nope/{action}", data={"csrf": csrf, "name": "go"})
            assert r.status_code == 404
            assert parse(r.text).by_id("not-found") is not None
    assert await store.get_run("nope") is None


async def test_cancel_of_a_running_holder_is_finished_by_its_worker(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        kind, text, doc = await _post(c, "holder", "cancel")
    assert kind == "ok" and "cancelling" in text
    assert doc.by_id("run-status").get("data-status") == "cancelling"
    async with Engine(store, WORKFLOWS, poll_interval=0.05):

        async def cancelled() -> bool:
            return await status_of(store, "holder") == "cancelled"

        await until(cancelled, "the holder to settle cancelled")


async def test_a_live_refresh_between_the_redirect_and_the_page_leaves_the_flash(
    store: Any,
) -> None:
    """The page's live refresh (``app.js``: a fetch of the page with ``X-Flowkit-Refresh``)
    may land between an action's redirect and the page load: it must neither show nor take
    the flash, which the page load then shows (a browser test saw the flash vanish)."""
    await seed(store)
    async with client(store) as c:
        csrf = csrf_of((await c.get("/runs/waiter-2")).text)
        r = await c.post("/runs/waiter-2/cancel", data={"csrf": csrf})
        assert r.status_code == 303
        live = await c.get(r.headers["location"], headers={"X-Flowkit-Refresh": "1"})
        assert live.status_code == 200 and parse(live.text).by_id("flash") is None
        page = await c.get(r.headers["location"])
        flash = parse(page.text).by_id("flash")
        assert flash is not None and flash.get("data-kind") == "ok"
