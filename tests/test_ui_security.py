"""The dashboard's security over HTTP (docs/ui.md "Security"): the token, then a cookie; the
login form without one; every action behind the cookie, the CSRF value and a same-origin check,
writing nothing when refused; ``read_only``; the CSP and other headers on every response."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from ui_kit import BASE, TOKEN, XSS, client, csrf_of, parse, seed

from flowkit.cli.ui import create_app
from flowkit.cli.ui._auth import Keys

PAGES = ["/runs", "/runs/holder", "/lanes", f"/lanes/lane/{XSS}", "/events", "/"]


async def _snapshot(store: Any, run_id: str) -> tuple[str, int, int, bool]:
    run = await store.get_run(run_id)
    events = await store.load_events(run_id)
    inbox = await store.peek_signal(run_id, "go")
    return str(run.status), run.attempt, len(events), inbox is not None


async def test_without_the_cookie_every_page_is_401_with_the_login_form(store: Any) -> None:
    await seed(store)
    async with client(store, login=False) as c:
        for url in PAGES:
            r = await c.get(url)
            assert r.status_code == 401, url
            assert r.headers["content-security-policy"] == "default-src 'self'"
            doc = parse(r.text)
            form = doc.by_id("login")
            assert form is not None and form.get("method") == "get", url
            form.one("input", name="token")
            assert form.by_id("login-button") is not None
            assert "waiter-1" not in r.text and XSS not in r.text  # (nothing of the store shows)


async def test_the_token_sets_the_cookie_and_redirects_without_it(store: Any) -> None:
    await seed(store)
    async with client(store, login=False) as c:
        r = await c.get(f"/runs?status=failed&token={TOKEN}&tag=x")
        assert r.status_code == 303
        assert r.headers["location"] == "/runs?status=failed&tag=x"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("flowkit_ui=")
        low = cookie.lower()
        assert "httponly" in low and "samesite=strict" in low and "path=/" in low
        assert TOKEN not in cookie  # (a key derived from the token, not the token)
        page = await c.get("/runs?status=failed")
        assert page.status_code == 200
        assert [r.get("data-run-id") for r in parse(page.text).all("tr", "run")] == ["failed"]
        for url in PAGES[:-2]:
            assert (await c.get(url)).status_code == 200, url


async def test_a_wrong_token_is_401(store: Any) -> None:
    await seed(store)
    async with client(store, login=False) as c:
        for wrong in ("nope", TOKEN + "x", "", XSS):
            r = await c.get("/runs", params={"token": wrong})
            assert r.status_code == 401
            assert "set-cookie" not in r.headers
            assert XSS not in r.text
            assert parse(r.text).by_id("login") is not None
        c.cookies.set("flowkit_ui", TOKEN)  # (the token itself is not the cookie's value)
        assert (await c.get("/runs")).status_code == 401


async def test_every_response_carries_the_csp(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        for url in ("/runs", "/runs/holder", "/lanes", "/runs/nope", "/static/app.js", "/"):
            r = await c.get(url)
            assert r.headers["content-security-policy"] == "default-src 'self'", url
            assert r.headers["x-frame-options"] == "DENY"
            assert r.headers["x-content-type-options"] == "nosniff"
            # (with no-referrer, Chromium posts the action forms with `Origin: null`)
            assert r.headers["referrer-policy"] == "same-origin"
        html = (await c.get("/runs/holder")).text
        assert "style=" not in html and "onclick" not in html.lower()
        assert "<style" not in html and '<script src="/static/app.js"' in html


async def test_static_files_need_no_token(store: Any) -> None:
    async with client(store, login=False) as c:
        js = await c.get("/static/app.js")
        css = await c.get("/static/app.css")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "EventSource" in js.text and "DOMParser" in js.text
    assert css.status_code == 200 and ".status-failed" in css.text


@pytest.mark.parametrize(
    "how",
    [
        "no csrf",
        "wrong csrf",
        "another token's csrf",
        "cross-site origin",
        "null origin",
        "sec-fetch-site cross-site",
        "no cookie",
    ],
)
async def test_actions_refused_without_csrf_or_from_another_site(store: Any, how: str) -> None:
    await seed(store)
    before = {rid: await _snapshot(store, rid) for rid in ("holder", "failed", "waiter-2")}
    async with client(store) as c:
        csrf = csrf_of((await c.get("/runs/holder")).text)
        data: dict[str, str] = {"csrf": csrf}
        headers: dict[str, str] = {}
        if how == "no csrf":
            data = {}
        elif how == "wrong csrf":
            data["csrf"] = csrf[:-1] + ("0" if csrf[-1] != "0" else "1")
        elif how == "another token's csrf":
            data["csrf"] = Keys("another").csrf
        elif how == "cross-site origin":
            headers["origin"] = "http://evil.example"
        elif how == "null origin":
            headers["origin"] = "null"
        elif how == "sec-fetch-site cross-site":
            headers["sec-fetch-site"] = "cross-site"
        elif how == "no cookie":
            c.cookies.clear()
        for rid, action, more in (
            ("waiter-2", "cancel", {}),
            ("failed", "retry", {}),
            ("holder", "signal", {"name": "go", "payload": '{"ok": 1}'}),
        ):
            r = await c.post(f"/runs/{rid}/{action}", data={**data, **more}, headers=headers)
            assert r.status_code == 403, (how, action, r.text)
    after = {rid: await _snapshot(store, rid) for rid in before}
    assert after == before


async def test_same_origin_post_passes(store: Any) -> None:
    await seed(store)
    async with client(store) as c:
        csrf = csrf_of((await c.get("/runs/waiter-2")).text)
        r = await c.post(
            "/runs/waiter-2/cancel",
            data={"csrf": csrf},
            headers={"origin": BASE, "sec-fetch-site": "same-origin"},
        )
    assert r.status_code == 303
    assert (await store.get_run("waiter-2")).status == "cancelled"


async def test_read_only_renders_no_form_and_refuses_every_post(store: Any) -> None:
    await seed(store)
    before = {rid: await _snapshot(store, rid) for rid in ("holder", "failed", "waiter-2")}
    async with client(store, read_only=True) as c:
        for url in ("/runs", "/runs/holder", "/runs/failed", "/lanes"):
            r = await c.get(url)
            assert r.status_code == 200
            doc = parse(r.text)
            assert doc.one("body").get("data-read-only") == "true"
            assert doc.by_id("actions") is None
            assert not [f for f in doc.all("form") if (f.get("method") or "").lower() == "post"]
            assert 'name="csrf"' not in r.text
        csrf = Keys(TOKEN).csrf
        for url, data in (
            ("/runs/waiter-2/cancel", {"csrf": csrf}),
            ("/runs/failed/retry", {"csrf": csrf}),
            ("/runs/holder/signal", {"csrf": csrf, "name": "go", "payload": "1"}),
            ("/runs", {}),
            ("/runs/holder", {}),
            ("/events", {}),
        ):
            r = await c.post(url, data=data, headers={"origin": BASE})
            assert r.status_code == 403, url
        r = await c.put("/runs/holder/cancel", data={"csrf": csrf})
        assert r.status_code == 403
    after = {rid: await _snapshot(store, rid) for rid in before}
    assert after == before


async def test_create_app_needs_a_token(store: Any) -> None:
    for bad in ("", None):
        with pytest.raises(ValueError, match="token"):
            create_app(store, token=bad)  # type: ignore[arg-type]
    app = create_app(store, token="t")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        assert (await c.get("/")).status_code == 401
        r = await c.get("/?token=t")
        assert r.status_code == 303 and r.headers["location"] == "/"
        r = await c.get("/")
        assert r.status_code == 303 and r.headers["location"] == "/runs"


class _Clock:
    """A clock the test moves."""

    def __init__(self, at: float) -> None:
        self.at = at

    def now(self) -> float:
        return self.at


async def test_the_login_cookie_expires() -> None:
    from flowkit.cli.ui._auth import SESSION_SECONDS
    from flowkit.stores import MemoryStore

    clock = _Clock(1_000_000.0)
    app = create_app(MemoryStore(), token=TOKEN, clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        r = await c.get(f"/runs?token={TOKEN}")
        assert r.status_code == 303
        low = r.headers["set-cookie"].lower()
        assert f"max-age={SESSION_SECONDS}" in low
        value = c.cookies["flowkit_ui"]
        assert TOKEN not in value
        clock.at += SESSION_SECONDS - 1
        assert (await c.get("/runs")).status_code == 200
        # a value with a later expiry of its own making does not pass: the expiry is signed
        stamp, _, mac = value.partition(".")
        c.cookies.set("flowkit_ui", f"{int(stamp) + 3600}.{mac}")
        assert (await c.get("/runs")).status_code == 401
        # past its lifetime the cookie (even kept by a browser that ignores Max-Age) is refused
        c.cookies.set("flowkit_ui", value)
        clock.at += 1
        r = await c.get("/runs")
        assert r.status_code == 401 and parse(r.text).by_id("login") is not None
        c.cookies.clear()
        assert (await c.get(f"/runs?token={TOKEN}")).status_code == 303  # (log in again)
        assert (await c.get("/runs")).status_code == 200
