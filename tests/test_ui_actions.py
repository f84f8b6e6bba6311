"""The dashboard's actions over HTTP (docs/ui.md "Actions"): cancel, retry, signal with a JSON
payload, each answered by a redirect to the run with a flash; a bad payload, a run in the wrong
state or an input its workflow's recorded schema refuses is an error flash and writes
nothing."""

from __future__ import annotations

from typing import Any

import httpx
from ui_kit import TOKEN, WORKFLOWS, XSS, client, csrf_of, parse, seed, status_of, until

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.cli.ui._auth import Keys


async def _post(c: httpx.AsyncClient, run_id: str, action: str, **fields: str) -> Any:
    """Post an action form as a browser would (the CSRF value read off the run's page; one
    with no action form: a crafted request with the right value), follow the redirect; the
    run page after it, parsed."""
    html = (await c.get(f"/runs/{run_id}")).text
    csrf = csrf_of(html) if 'name="csrf"' in html else Keys(TOKEN).csrf
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
    assert kind == "error" and text == (
        "cancel refused: the run is completed: only an active run can be cancelled"
    )
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


FORMS = {"cancel": "cancel-form", "retry": "retry-form", "signal": "signal-form"}


def _offered(doc: Any) -> set[str]:
    """The actions a run page offers (its forms)."""
    return {a for a, form in FORMS.items() if doc.by_id(form) is not None}


async def test_a_run_page_offers_only_what_its_status_allows(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        await _post(c, "waiter-2", "cancel")  # (cancelled at once: never admitted)
        csrf = csrf_of((await c.get("/runs/holder")).text)
        assert (await c.post("/runs/holder/cancel", data={"csrf": csrf})).status_code == 303
        want = {
            "waiter-1": {"cancel", "signal"},  # suspended
            "holder": {"signal"},  # cancelling
            "failed": {"retry"},
            "tagged": set(),  # completed
            "waiter-2": set(),  # cancelled
        }
        for run_id, offered in want.items():
            doc = parse((await c.get(f"/runs/{run_id}")).text)
            assert _offered(doc) == offered, run_id
            actions = doc.by_id("actions")
            assert actions is not None and actions.get("data-actions") == " ".join(
                a for a in FORMS if a in offered
            )
            assert (doc.by_id("no-actions") is None) == bool(offered), run_id


async def test_a_post_the_status_does_not_allow_is_refused_and_writes_nothing(
    store: Any,
) -> None:
    await seed(store)
    frozen = {rid: await _frozen(store, rid) for rid in ("tagged", "failed", "waiter-1")}
    async with client(store) as c:
        refusals = [
            ("tagged", "cancel", {}, "only an active run can be cancelled"),
            ("tagged", "signal", {"name": "go"}, "only an active run takes signals"),
            ("failed", "cancel", {}, "the run is failed"),
            ("failed", "signal", {"name": "go"}, "the run is failed"),
            ("waiter-1", "retry", {}, "only failed or dead runs can be retried"),
        ]
        for run_id, action, fields, says in refusals:
            kind, text, _ = await _post(c, run_id, action, **fields)
            assert kind == "error" and says in text and "refused" in text, (run_id, action)
    for rid, before in frozen.items():
        assert await _frozen(store, rid) == before
    assert await store.peek_signal("tagged", "go") is None
    assert await store.peek_signal("failed", "go") is None


@workflow(name="saga")
class Saga:
    """Books, then fails: its compensation undoes the booking."""

    async def book(self) -> str:
        return "booked"

    async def undo(self, booking: str) -> None:
        return None

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        await ctx.step(self.book, compensate=self.undo)
        raise ValueError("no car left")


async def test_a_failed_run_whose_compensations_ran_offers_no_retry(store: Any) -> None:
    async with Engine(store, [Saga()], poll_interval=0.05) as engine:
        await engine.start("saga", None, "saga")

        async def failed() -> bool:
            return await status_of(store, "saga") == "failed"

        await until(failed, "the saga to fail")
    types = [e.type for e in await store.load_events("saga")]
    assert "compensation_completed" in types
    before = await _frozen(store, "saga")
    async with client(store) as c:
        doc = parse((await c.get("/runs/saga")).text)
        assert _offered(doc) == set()
        assert "compensations ran" in doc.by_id("no-actions").text  # type: ignore[union-attr]
        kind, text, _ = await _post(c, "saga", "retry")
    assert kind == "error" and "compensations ran" in text
    assert await _frozen(store, "saga") == before
