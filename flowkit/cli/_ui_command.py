"""``flowkit ui``: the web dashboard (docs/ui.md; ``flowkit.cli.ui``), served by uvicorn. Needs the
``ui`` extra (``pip install 'flowkit[ui]'``): without it the command says so and exits 2.

Bound to a loopback address it makes up a token when none is given and prints the URL that
carries it (the browser keeps it in a cookie); bound anywhere else it refuses to start without
``--token`` / ``$FLOWKIT_UI_TOKEN``. SIGTERM/SIGINT end the open live streams, then the server."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import secrets
import socket
from types import FrameType
from typing import Any

from ._common import CliError
from ._worker import load_app

__all__ = ["add_parser", "prepare", "ui"]

DEFAULT_PORT = 8233
GRACE = 3.0  # seconds uvicorn waits for open requests once told to stop


def add_parser(sub: Any) -> None:
    """The ``ui`` subcommand of ``flowkit``."""
    u = sub.add_parser("ui", help="serve the web dashboard (default http://127.0.0.1:8233)")
    u.add_argument("--db", default=argparse.SUPPRESS, help="store URL (default: $FLOWKIT_DB)")
    u.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    u.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8233; 0: any)")
    u.add_argument("--read-only", action="store_true", help="no cancel/retry/signal actions")
    u.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        default=None,
        help="the workflows (as for flowkit worker): retry with a new input, typed signals",
    )
    u.add_argument("--token", default=None, help="the token pages need ($FLOWKIT_UI_TOKEN)")
    u.add_argument(
        "--token-file",
        metavar="PATH",
        default=None,
        help="read the token from this file (kept out of the process' command line)",
    )


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``): only this machine reaches
    it."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def prepare(args: argparse.Namespace) -> None:
    """Checks done before the store opens: the extra is installed, the port is one, and a
    host other than loopback has a token."""
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise CliError(
            f"flowkit ui needs the ui extra (pip install 'flowkit[ui]'): {exc}"
        ) from None
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port takes 0..65535 (0: any free port), got {args.port}")
    if args.token is not None and args.token_file is not None:
        raise CliError("give --token or --token-file, not both")
    if args.token_file is not None:
        token: str | None = _read_token(args.token_file)
    elif args.token is not None:
        token = args.token
    else:
        token = os.environ.get("FLOWKIT_UI_TOKEN")
    if token is not None and not token.strip():
        raise CliError("--token (or $FLOWKIT_UI_TOKEN) is empty")
    if token is None:
        if not loopback(args.host):
            raise CliError(
                f"--host {args.host} is reachable from other machines: set --token or "
                "$FLOWKIT_UI_TOKEN (actions and pages need it)"
            )
        token = secrets.token_urlsafe(24)
        args.ui_token_shown = True  # (made up here: the printed URL is the only way to it)
    else:
        args.ui_token_shown = False  # (the operator's: never printed, logs keep stdout)
    args.ui_token = token
    # (imported now, before the store opens and the loop starts: a bad app is one line)
    args.ui_workflows = [] if args.app is None else load_app(args.app)


def _read_token(path: str) -> str:
    """The token in the file ``path``: its first line, without surrounding whitespace."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"--token-file {path}: {reason}") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise CliError(f"--token-file {path} is empty")
    return token


def _url(host: str, port: int, token: str | None) -> str:
    """The dashboard's URL (with the token only when it was made up here)."""
    bare = host.strip("[]")
    shown = f"[{bare}]" if ":" in bare else bare
    return f"http://{shown}:{port}/" + (f"?token={token}" if token is not None else "")


async def ui(args: argparse.Namespace, out: Any, store: Any) -> int:
    """Serve the dashboard on ``store`` until SIGTERM/SIGINT (exit 0)."""
    import uvicorn

    from .ui import create_app

    app = create_app(
        store, token=args.ui_token, read_only=args.read_only, workflows=args.ui_workflows
    )
    dashboard = app.state.dashboard
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host.strip("[]"), args.port))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(GRACE),
        lifespan="on",
    )

    class Server(uvicorn.Server):
        """uvicorn, ending the live streams first when told to stop (an open page would
        otherwise hold the shutdown until the grace period ends), and exiting 0 on a signal
        rather than raising it again."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            # (the URL is printed once the socket accepts connections: whoever waits for the
            # line may connect at once)
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                print(f"flowkit ui: serving {_url(args.host, port, shown)}", flush=True)
                if args.read_only:
                    print("flowkit ui: read-only (no actions)", flush=True)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(dashboard.changes.close_streams)
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True

    loop = asyncio.get_running_loop()
    shown = args.ui_token if args.ui_token_shown else None
    server = Server(config)
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
    return 0
