"""The dashboard's tests' common parts: seeded runs covering every page (a singleton lane with
a holder and two waiters, a failed run, a parent with a child, a run with tags and search
attributes, a workflow and a signal name that are markup), and an HTTP client logged in to a
``flowkit.cli.ui.create_app`` in the test's own event loop (httpx's ASGI transport)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx

from flowkit import Engine, Run, Singleton, WorkflowCtx, workflow
from flowkit.cli.ui import create_app

XSS = "<script>alert(1)</script>"
TOKEN = "test-token"
BASE = "http://testserver"


@workflow(name="lane", singleton=Singleton(key=lambda inp: inp["key"]))
class LaneWf:
    """Holds its lane's slot until signal ``go``; returns its payload."""

    async def run(self, ctx: WorkflowCtx, inp: dict[str, Any]) -> Any:
        return await ctx.wait_for_signal("go")


@workflow(name="echo")
class Echo:
    """Returns its input."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        return inp


@workflow(name="fails")
class Fails:
    """Fails with markup in its message."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        raise ValueError(f"bad row: {XSS}")


@workflow(name="parent")
class Parent:
    """Runs one child (``echo``) and returns its output."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        return await ctx.child("echo", inp)


@workflow(name=XSS)
class Markup:
    """A workflow named with markup, waiting for a signal named with markup."""

    async def run(self, ctx: WorkflowCtx, inp: Any) -> Any:
        return await ctx.wait_for_signal(XSS)


WORKFLOWS = [LaneWf(), Echo(), Fails(), Parent(), Markup()]
SEEDED = ["holder", "waiter-1", "waiter-2", "failed", "parent", "tagged", "markup"]


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 20.0) -> None:
    """Poll ``check`` until true; ``AssertionError`` naming ``what`` after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def status_of(store: Any, run_id: str) -> str:
    run: Run | None = await store.get_run(run_id)
    assert run is not None, run_id
    return str(run.status)


async def seed(store: Any) -> None:
    """Start the seeded runs and let a worker take each to where it rests, then stop it."""
    async with Engine(store, WORKFLOWS, poll_interval=0.05) as engine:
        for rid in ("holder", "waiter-1", "waiter-2"):
            await engine.start("lane", {"key": XSS, "note": XSS}, rid)
        await engine.start("fails", XSS, "failed")
        await engine.start("parent", {"n": 1}, "parent")
        await engine.start(
            "echo",
            {"html": XSS},
            "tagged",
            tags=[XSS, "billing"],
            search={"customer": XSS, "amount": 120},
        )
        await engine.start(XSS, None, "markup")

        async def rested() -> bool:
            runs = {r.id: r for r in await store.list_runs()}
            want = {"failed": "failed", "parent": "completed", "tagged": "completed"}
            if any(rid not in runs or runs[rid].status != s for rid, s in want.items()):
                return False
            return bool(runs["holder"].waiting_signals) and bool(runs["markup"].waiting_signals)

        await until(rested, "the seeded runs to rest")


@asynccontextmanager
async def client(
    store: Any,
    *,
    read_only: bool = False,
    login: bool = True,
    workflows: Sequence[Any] = (),
    base: str = BASE,
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a dashboard on ``store`` (logged in unless ``login=False``)."""
    app = create_app(store, token=TOKEN, read_only=read_only, workflows=workflows)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=base) as c:
        if login:
            r = await c.get(f"/runs?token={TOKEN}")
            assert r.status_code == 303, r.text
        yield c


def csrf_of(html: str) -> str:
    """The CSRF value of a page's action forms."""
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m is not None, "no action form on the page"
    return m.group(1)


def ids_in(html: str, selector_attr: str = "data-run-id") -> list[str]:
    """The values of ``data-run-id`` (or another attribute) in page order."""
    return re.findall(rf'{selector_attr}="([^"]*)"', html)


# -- a small DOM (stdlib html.parser) to look pages up by id, class and attribute -----------

VOID = {"meta", "link", "input", "br", "img", "hr", "source", "col", "area", "base", "wbr"}


class El:
    """An element: tag, attributes, children, and its text (with its descendants')."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: El | None) -> None:
        self.tag = tag
        self.attrs = attrs
        self.parent = parent
        self.children: list[El] = []
        self.parts: list[str | El] = []

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.attrs.get(name, default)

    def iter(self) -> Any:
        for c in self.children:
            yield c
            yield from c.iter()

    def all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[El]:
        """Descendants matching a tag, a class and attribute values (``data_run_id=``)."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in self.iter()
            if (tag is None or e.tag == tag)
            and (cls is None or cls in e.classes)
            and all(e.attrs.get(k) == v for k, v in want.items())
        ]

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> El:
        found = self.all(tag, cls, **attrs)
        assert len(found) == 1, (tag, cls, attrs, len(found))
        return found[0]

    def by_id(self, id: str) -> El | None:
        return next((e for e in self.iter() if e.attrs.get("id") == id), None)


def parse(html: str) -> El:
    """A page as a tree of ``El``."""
    from html.parser import HTMLParser

    root = El("#document", {}, None)

    class P(HTMLParser):
        cur = root

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            el = El(tag, {k: v if v is not None else "" for k, v in attrs}, self.cur)
            self.cur.children.append(el)
            self.cur.parts.append(el)
            if tag not in VOID:
                self.cur = el

        def handle_endtag(self, tag: str) -> None:
            node: El | None = self.cur
            while node is not None and node.tag != tag:
                node = node.parent
            if node is not None and node.parent is not None:
                self.cur = node.parent

        def handle_data(self, data: str) -> None:
            self.cur.parts.append(data)

    P(convert_charrefs=True).feed(html)
    return root
