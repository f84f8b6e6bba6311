"""The web dashboard behind ``flowkit ui`` (DESIGN §12): a Starlette app rendering Jinja2
templates, with a little plain JavaScript for live updates (server-sent events) and no build
step. ``create_app`` builds it on a store; ``flowkit._cli_ui`` serves it with uvicorn."""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def create_app(store: Any, *, token: str, read_only: bool = False) -> Any:
    """The dashboard's ASGI app over ``store``: pages need ``token`` once (it is kept in a
    cookie); actions need it and a CSRF token; ``read_only`` refuses every action."""
    raise NotImplementedError("the dashboard is built in fix/ui")
