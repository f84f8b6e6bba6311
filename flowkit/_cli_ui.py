"""``flowkit ui``: the web dashboard (DESIGN §12; ``flowkit._ui``), served by uvicorn. Needs the
``ui`` extra (``pip install 'flowkit[ui]'``): without it the command says so and exits 2."""

from __future__ import annotations

import argparse
from typing import Any

from ._cli_common import CliError

__all__ = ["add_parser", "prepare", "ui"]

DEFAULT_PORT = 8233


def add_parser(sub: Any) -> None:
    """The ``ui`` subcommand of ``flowkit``."""
    u = sub.add_parser("ui", help="serve the web dashboard (default http://127.0.0.1:8233)")
    u.add_argument("--db", default=argparse.SUPPRESS, help="store URL (default: $FLOWKIT_DB)")
    u.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    u.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8233)")
    u.add_argument("--read-only", action="store_true", help="no cancel/retry/signal actions")
    u.add_argument("--token", default=None, help="the token actions need ($FLOWKIT_UI_TOKEN)")


def prepare(args: argparse.Namespace) -> None:
    """Checks done before the store opens (``--host`` other than loopback needs a token)."""
    raise CliError("flowkit ui: not built yet")


async def ui(args: argparse.Namespace, out: Any, store: Any) -> int:
    """Serve the dashboard on ``store`` until SIGTERM/SIGINT."""
    raise CliError("flowkit ui: not built yet")
