"""The dashboard's routes (the DOM they render: docs/ui.md): pages behind the token cookie,
``POST`` actions behind the cookie, the CSRF value, a same-origin check and the run's status,
``/events`` for live updates (a run's page: what changed, ``_run_delta``; the others: a
``change`` to fetch themselves again), ``/static`` for app.js and app.css."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..._client import browse as _browse
from ..._client import retry as _retry
from ..._client import schemas as _schemas
from ..._client.engine import Engine
from ..._core.clock import SystemClock
from ..._core.run import RunStatus
from ..._model.definition import definition_of
from ...errors import FlowkitError
from ...events import Event
from ...stores.base import UNSET
from . import _views
from ._auth import (
    SECURITY_HEADERS,
    SESSION_SECONDS,
    Keys,
    cookie_name,
    same_origin,
    url_without_token,
)
from ._fmt import ago, iso
from ._sse import Changes

__all__ = ["create_app"]

HERE = Path(__file__).resolve().parent
FLASH_COOKIE = "flowkit_ui_flash"
REFRESH_HEADER = "x-flowkit-refresh"  # sent by app.js's live refresh of a page


class _Headers:
    """ASGI middleware adding the security headers (CSP, ...) to every HTTP response, and
    refusing every ``POST`` (any method but GET/HEAD) of a read-only dashboard."""

    def __init__(self, app: ASGIApp, read_only: bool) -> None:
        self.app = app
        self.read_only = read_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.read_only and scope["method"] not in ("GET", "HEAD"):
            await _plain("the dashboard is read-only", 403)(scope, receive, send)
            return

        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with)


class Dashboard:
    """The state the routes share: the store, the keys, the templates, the doorbell."""

    def __init__(self, store: Any, token: str, read_only: bool, clock: Any) -> None:
        self.store = store
        self.keys = Keys(token)
        self.read_only = read_only
        self.clock = clock
        self.changes = Changes(store)
        self.workflows: list[Any] = []  # (``create_app(workflows=)``)
        self.definitions: list[Any] = []  # (their definitions: lane limits)
        self.known: set[str] = set()
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals["iso"] = iso
        self.env.filters["q"] = _views.quote
        self.env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
        self.env.globals["ago"] = lambda ts: ago(ts, self.clock.now())

    # -- rendering -----------------------------------------------------------------------
    def render(
        self, request: Request, name: str, ctx: dict[str, Any], status: int = 200
    ) -> Response:
        # (a live refresh never takes the flash: it may run between an action's redirect
        # and the page load that must show it, and it only swaps the live sections)
        refresh = request.headers.get(REFRESH_HEADER) is not None
        flash = None if refresh else _read_flash(request)
        html = self.env.get_template(name).render(
            **ctx,
            read_only=self.read_only,
            csrf=self.keys.csrf,
            flash=flash,
            now=self.clock.now(),
        )
        resp = HTMLResponse(html, status_code=status)
        if flash is not None:
            resp.delete_cookie(FLASH_COOKIE, path="/")
        return resp

    def fragment(self, name: str, ctx: dict[str, Any]) -> Markup:
        """A part of a page (a run's state, its actions, timeline rows), rendered alone: what
        a run's page embeds and its live stream sends when it changed."""
        html = self.env.get_template(name).render(
            **ctx, read_only=self.read_only, csrf=self.keys.csrf, now=self.clock.now()
        )
        return Markup(html)

    def login(self, request: Request, wrong: bool) -> Response:
        html = self.env.get_template("login.html").render(
            page="login",
            wrong=wrong,
            action=request.url.path,
            read_only=self.read_only,
            query=[(k, v) for k, v in request.query_params.multi_items() if k != "token"],
            flash=None,
        )
        return HTMLResponse(html, status_code=401)

    # -- auth ----------------------------------------------------------------------------
    def gate(self, request: Request) -> Response | None:
        """``None`` when the request may see pages, else the response: a login redirect
        (correct ``?token=``), or 401 with the login form."""
        given = request.query_params.get("token")
        if given is not None:
            if not self.keys.token_ok(given):
                return self.login(request, wrong=True)
            resp = RedirectResponse(url_without_token(request), status_code=303)
            name = cookie_name(request)
            resp.set_cookie(
                name,
                self.keys.session(self.clock.now()),
                max_age=SESSION_SECONDS,
                httponly=True,
                samesite="strict",
                path="/",
            )
            return resp
        if self.keys.cookie_ok(request, self.clock.now()):
            return None
        return self.login(request, wrong=False)


def _read_flash(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(raw.encode()).decode())
        kind, text = data["kind"], data["text"]
    except (ValueError, KeyError, TypeError):
        return None
    if kind not in ("ok", "error") or not isinstance(text, str):
        return None
    return {"kind": kind, "text": text}


def _redirect_with_flash(url: str, kind: str, text: str) -> Response:
    resp = RedirectResponse(url, status_code=303)
    raw = json.dumps({"kind": kind, "text": text[:500]})
    value = base64.urlsafe_b64encode(raw.encode()).decode()
    resp.set_cookie(FLASH_COOKIE, value, httponly=True, samesite="strict", path="/", max_age=60)
    return resp


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


Handler = Callable[[Dashboard, Request], Awaitable[Response]]


def _page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        d: Dashboard = request.app.state.dashboard
        refused = d.gate(request)
        if refused is not None:
            return refused
        return await handler(d, request)

    return endpoint


async def _home(d: Dashboard, request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def _runs(d: Dashboard, request: Request) -> Response:
    ctx = await _views.runs_context(d.store, request.query_params)
    return d.render(request, "runs.html", ctx, status=400 if ctx["errors"] else 200)


async def _retry_with_input(d: Dashboard, run: Any) -> bool:
    """Whether a retry may take a new input here: the workflow's code checks it (``--app``),
    else the input schema its workers recorded (docs/updates.md, "Callers without the code")."""
    if run.workflow in d.known:
        return True
    return run.status in _retry.RETRYABLE and await _schemas.recorded(d.store, run) is not None


async def _not_found(d: Dashboard, request: Request, what: str) -> Response:
    return d.render(request, "not_found.html", {"page": "runs", "what": what}, status=404)


async def _run(d: Dashboard, request: Request) -> Response:
    run_id = request.path_params["run_id"]
    run = await d.store.get_run(run_id)
    if run is None:
        return await _not_found(d, request, f"run {run_id}")
    ctx = await _views.run_context(d.store, run, request.query_params, d.definitions)
    ctx["retry_with_input"] = await _retry_with_input(d, run)
    state_html = d.fragment("_run_state.html", ctx)
    actions_html = d.fragment("_run_actions.html", ctx)
    ctx["state_html"] = state_html
    ctx["state_tag"] = _tag(state_html)
    ctx["actions_html"] = actions_html
    ctx["events_html"] = d.fragment("_events.html", ctx)
    stream = {
        "run": run.id,
        "after": str(ctx["last_seq"]),
        "follow": "1" if ctx["follow"] else "0",
        "tag": ctx["state_tag"],
        "actions": _tag(actions_html),
    }
    if ctx["children_after"]:
        stream["children_after"] = ctx["children_after"]
    ctx["stream_url"] = "/events?" + urlencode(stream)
    return d.render(request, "run.html", ctx, status=400 if ctx["errors"] else 200)


_TIME_TEXT = re.compile(r"(<time\b[^>]*>)[^<]*(</time>)")


def _tag(html: str) -> str:
    """A fingerprint of a rendered part, blind to the relative times in it ("3 s ago", which
    the page keeps fresh itself): equal tags, nothing to send."""
    return hashlib.sha256(_TIME_TEXT.sub(r"\1\2", html).encode()).hexdigest()[:20]


def _sse(name: str, data: dict[str, Any], id: int | None = None) -> str:
    head = f"event: {name}\n" + (f"id: {id}\n" if id is not None else "")
    return head + "data: " + json.dumps(data, ensure_ascii=False) + "\n\n"


MAX_PAGES_PER_CHANGE = 10


@dataclass
class _Seen:
    """What a run's live stream has sent (or the page had): the last event, the count of
    events (``follow=0``), the tags of the state and actions parts."""

    after: int
    tag: str
    actions: str
    count: int = -1


def _run_delta(d: Dashboard, request: Request) -> Callable[[], Awaitable[list[str]]]:
    """What a run's page needs after a change, as server-sent events: ``events`` (the rows
    past the last the page has; with ``follow=0`` only how many there are), ``state`` (its
    live part, when it changed), ``actions`` (the forms, when the allowed set changed),
    ``gone`` (the run was deleted)."""
    params = request.query_params
    run_id = params.get("run", "")
    q, _ = _views.run_query({"children_after": params.get("children_after", "")})
    follow = params.get("follow") == "1"
    last = params.get("after", "")
    resumed = request.headers.get("last-event-id", "")  # (a reconnect: what it got last)
    seen = _Seen(
        after=max(int(v) for v in (last, resumed, "0") if v.isdigit() and len(v) < 16),
        tag=params.get("tag", ""),
        actions=params.get("actions", ""),
    )

    async def delta() -> list[str]:
        run = await d.store.get_run(run_id)
        if run is None:
            return [_sse("gone", {})]
        out = []
        for i in range(MAX_PAGES_PER_CHANGE if follow else 1):
            page = await _browse.page_events(
                d.store, run_id, after=seen.after, limit=_views.EVENT_PAGE if follow else 0
            )
            if not follow:
                if page.count != seen.count:
                    seen.count = page.count
                    out.append(_sse("events", {"count": page.count, "last": page.last_seq}))
                break
            if not page.events:
                break
            reset = False
            behind = (page.last_seq or 0) - seen.after
            if i == 0 and behind > MAX_PAGES_PER_CHANGE * _views.EVENT_PAGE:
                # (far behind: the newest page, not every row since; older ones a link away)
                page = await _browse.page_events(d.store, run_id, limit=_views.EVENT_PAGE)
                reset = True
            seen.after = page.events[-1].seq
            rows = {"timeline": _views.timeline_items(page.events, run.created_at)}
            html = str(d.fragment("_events.html", rows))
            body = {"html": html, "last": seen.after, "count": page.count, "reset": reset}
            out.append(_sse("events", body, id=seen.after))
        ctx = await _views.state_context(d.store, run, q, d.definitions)
        ctx["retry_with_input"] = await _retry_with_input(d, run)
        state = d.fragment("_run_state.html", ctx)
        if _tag(state) != seen.tag:
            seen.tag = _tag(state)
            out.append(_sse("state", {"html": str(state), "tag": seen.tag}))
        if not d.read_only:
            actions = d.fragment("_run_actions.html", ctx)
            if _tag(actions) != seen.actions:
                seen.actions = _tag(actions)
                out.append(_sse("actions", {"html": str(actions), "tag": seen.actions}))
        return out

    return delta


async def _lanes(d: Dashboard, request: Request) -> Response:
    return d.render(request, "lanes.html", await _views.lanes_context(d.store, d.definitions))


async def _lane(d: Dashboard, request: Request) -> Response:
    # (from the raw path: a workflow or key holding "/" comes percent-encoded, and the decoded
    # path, which the router matches, no longer tells its segments apart)
    raw = request.scope.get("raw_path")
    rest = raw.decode("latin-1").split("?", 1)[0] if isinstance(raw, bytes) else ""
    wf_part, sep, key_part = rest.removeprefix("/lanes/").partition("/")
    if rest.startswith("/lanes/") and sep:
        wf, key = unquote(wf_part), unquote(key_part)
    else:
        wf, key = request.path_params["workflow"], request.path_params["key"]
    ctx = await _views.lane_context(d.store, wf, key, d.definitions)
    return d.render(request, "lane.html", ctx)


async def _events(d: Dashboard, request: Request) -> Response:
    delta = _run_delta(d, request) if request.query_params.get("run") else None
    return StreamingResponse(
        d.changes.stream(request.is_disconnected, delta),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


# -- actions -------------------------------------------------------------------------------


def _json_field(form: Any, name: str) -> tuple[bool, Any]:
    """A form field as JSON: ``(False, UNSET)`` when blank; ``ValueError`` when not JSON."""
    text = str(form.get(name) or "").strip()
    if not text:
        return False, UNSET
    try:
        return True, json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError(f"{name} is nested too deeply") from None


async def _act(d: Dashboard, request: Request, run_id: str, action: str, form: Any) -> str:
    """Perform one action on ``run_id``; its success line (errors raise)."""
    engine = Engine(d.store, d.workflows, worker=False)
    if action == "cancel":
        was = await d.store.get_run(run_id)
        run = await engine.cancel(run_id)
        if was is not None and was.status.terminal:
            return f"the run was already {was.status}: nothing to cancel"
        if run.status is RunStatus.CANCELLING:
            return "cancel requested: the run is cancelling (it stops at its next durable point)"
        return f"cancelled: the run is {run.status}"
    if action == "retry":
        _, value = _json_field(form, "input")
        run = await engine.retry(run_id, input=value)
        return f"retried: attempt {run.attempt}, {run.status} (a worker picks it up)"
    name = str(form.get("name") or "").strip()
    if not name:
        raise ValueError("a signal needs a name")
    given, payload = _json_field(form, "payload")
    await engine.signal(run_id, name, payload if given else None)
    return f"signal {name!r} delivered"


def _action(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        d: Dashboard = request.app.state.dashboard
        if d.read_only:
            return _plain("the dashboard is read-only", 403)
        if not same_origin(request):
            return _plain("cross-site request refused", 403)
        if not d.keys.cookie_ok(request, d.clock.now()):
            return _plain("actions need the token (open the dashboard's URL first)", 403)
        form = await request.form()
        if not d.keys.csrf_ok(str(form.get("csrf") or "")):
            return _plain("missing or wrong CSRF value (reload the page)", 403)
        run_id = request.path_params["run_id"]
        run = await d.store.get_run(run_id)
        if run is None:
            return await _not_found(d, request, f"run {run_id}")
        back = f"/runs/{_views.quote(run_id)}"
        comp = await _views.compensation_events(d.store, run_id) if action == "retry" else []
        if action not in _views.allowed_actions(run, bool(comp)):  # (no such form offered)
            what = action
            if action == "signal":
                what = f"signal {str(form.get('name') or '').strip()!r}"
            why = _refusal(action, run, comp)
            return _redirect_with_flash(back, "error", f"{what} refused: {why}")
        try:
            text = await _act(d, request, run_id, action, form)
        except (FlowkitError, ValueError, TypeError) as exc:
            return _redirect_with_flash(back, "error", f"{action} failed: {_one_line(exc)}")
        return _redirect_with_flash(back, "ok", text)

    return endpoint


def _refusal(action: str, run: Any, compensations: Sequence[Event]) -> str:
    """Why ``action`` is not offered for ``run`` (``_views.allowed_actions``)."""
    status = run.status
    if action == "cancel":
        if status is RunStatus.CANCELLING:
            return "the run is already cancelling"
        return f"the run is {status}: only an active run can be cancelled"
    if action == "retry":
        why = _retry.retry_refusal(run, compensations) if compensations else None
        if why is not None:
            return why
        return f"the run is {status}: only failed or dead runs can be retried"
    return f"the run is {status}: only an active run takes signals"


def _plain(text: str, status: int) -> Response:
    return Response(text + "\n", status_code=status, media_type="text/plain")


def create_app(
    store: Any,
    *,
    token: str,
    read_only: bool = False,
    clock: Any = None,
    workflows: Sequence[Any] = (),
) -> Starlette:
    """The dashboard's ASGI app over ``store`` (docs/ui.md). ``workflows`` (``flowkit ui
    --app``): the workflow code its actions may use, to retry a run with a new input (checked
    by the workflow's input type) and to check typed signals."""
    if not isinstance(token, str) or not token:
        raise ValueError("the dashboard needs a non-empty token")
    dashboard = Dashboard(store, token, read_only, clock or SystemClock())
    dashboard.workflows = list(workflows)
    dashboard.definitions = [d for wf in workflows if (d := definition_of(wf)) is not None]
    dashboard.known = {d.name for d in dashboard.definitions}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await dashboard.changes.close()

    routes = [
        Route("/", _page(_home)),
        Route("/runs", _page(_runs)),
        Route("/runs/{run_id:path}/cancel", _action("cancel"), methods=["POST"]),
        Route("/runs/{run_id:path}/retry", _action("retry"), methods=["POST"]),
        Route("/runs/{run_id:path}/signal", _action("signal"), methods=["POST"]),
        Route("/runs/{run_id:path}", _page(_run)),
        Route("/lanes", _page(_lanes)),
        Route("/lanes/{workflow}/{key:path}", _page(_lane)),
        Route("/events", _page(_events)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes, middleware=[Middleware(_Headers, read_only=read_only)], lifespan=lifespan
    )
    app.state.dashboard = dashboard
    return app
