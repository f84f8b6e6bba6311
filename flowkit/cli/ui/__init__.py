"""The web dashboard behind ``flowkit ui`` (docs/ui.md): a Starlette app rendering
Jinja2 templates, with a little plain JavaScript for live updates (server-sent events) and no
build step. ``create_app`` builds it on a store; ``flowkit.cli._ui_command`` serves it with uvicorn.
Needs the ``ui`` extra (starlette, jinja2, python-multipart; uvicorn to serve)."""

from __future__ import annotations

from ._app import create_app

__all__ = ["create_app"]
