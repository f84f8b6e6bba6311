"""PostgreSQL connections as flowkit opens them: the timeouts and keepalives it adds to a URL
unless the URL says otherwise (``configure_url``), a psycopg 3 connection whose every wait for
the server is bounded (``guarded_connection_class``), and a cheap check that an idle
connection is dead before a statement is sent on it (``peer_gone``).

Why and how: docs/stores.md, "Timeouts and failures"."""

from __future__ import annotations

import re
import socket
from typing import Any

import sqlalchemy as sa

CONNECT_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}
"""libpq parameters flowkit sets unless the URL does: a connect gives up after 5 s, and a dead
peer on a TCP link is noticed in about 10 s (keepalives, and ``tcp_user_timeout`` in ms for
data the peer never acknowledges). A unix socket ignores the TCP ones."""

SESSION_DEFAULTS = {
    "statement_timeout": "30s",
    "idle_in_transaction_session_timeout": "20s",
    "lock_timeout": None,
}
"""Server settings of flowkit's sessions (sent as ``options=-c name=value``) unless the URL
sets them, as a query parameter of the same name or inside its own ``options``: a statement
(lock waits included: a singleton key's advisory lock) is cancelled after 30 s, and a session
that stays idle inside a transaction for 20 s (a client gone silent) is ended, releasing its
row and advisory locks. ``lock_timeout`` is off unless the URL sets it."""

IO_TIMEOUT_PARAM = "flowkit_io_timeout"
"""The URL parameter of the client-side bound (seconds) on one wait for the server; by default
the statement timeout plus ``IO_MARGIN``."""
IO_MARGIN = 5.0

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _seconds(setting: str) -> float | None:
    """A PostgreSQL duration setting (``30s``, ``1500``: ms, ``2min``) in seconds; ``None``
    for 0 (off) or what this does not parse."""
    m = re.fullmatch(r"\s*'?(\d+(?:\.\d+)?)\s*([a-z]*)'?\s*", setting.lower())
    if m is None or (m.group(2) and m.group(2) not in _UNITS):
        return None
    value = float(m.group(1)) * _UNITS.get(m.group(2) or "ms", 1e-3)
    return value or None


POOLER_PARAM = "flowkit_pooler"
"""The URL parameter that says what sits between flowkit and PostgreSQL: ``transaction`` for
a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``); see ``take_pooler``."""
POOLER_MODES = ("session", "transaction")


def take_pooler(u: sa.URL) -> tuple[sa.URL, bool]:
    """``u`` without ``flowkit_pooler``, and whether it names a transaction-mode pooler: then
    flowkit prepares no statement (a pooler before PgBouncer 1.21 cannot route them), sends no
    session settings at connect (``options``: the pooler refuses or drops them; set them on
    the role instead) and listens for no wake-ups (``LISTEN`` needs a session of its own).
    ``ValueError`` for a mode it does not know."""
    mode = u.query.get(POOLER_PARAM)
    if mode is None:
        return u, False
    if mode not in POOLER_MODES:
        raise ValueError(f"{POOLER_PARAM} must be one of {', '.join(POOLER_MODES)}, got {mode!r}")
    return u.difference_update_query([POOLER_PARAM]), mode == "transaction"


def configure_url(u: sa.URL, *, session_settings: bool = True) -> tuple[sa.URL, float | None]:
    """``u`` with flowkit's connection defaults (``CONNECT_DEFAULTS``, ``SESSION_DEFAULTS``)
    wherever it sets nothing itself, and the client-side I/O bound in seconds (``None``: no
    bound): what the driver gets, every connection of the store's and its wake-up watcher's.
    Without ``session_settings`` (behind a transaction-mode pooler) only the ones the URL
    sets itself are sent."""
    query = {k: v for k, v in u.query.items()}
    settings: dict[str, str] = {}
    for name, default in SESSION_DEFAULTS.items():
        given = query.pop(name, None)
        value = given if isinstance(given, str) else (default if session_settings else None)
        if value is not None:
            settings[name] = value
    io = query.pop(IO_TIMEOUT_PARAM, None)
    for key, value in CONNECT_DEFAULTS.items():
        query.setdefault(key, value)
    options = query.get("options")
    options = options if isinstance(options, str) else ""
    extra = [f"-c {k}={v}" for k, v in settings.items() if f"{k}=" not in options]
    if extra:
        query["options"] = " ".join([options, *extra]).strip()
    if isinstance(io, str):
        try:
            io_timeout: float | None = float(io) or None
        except ValueError:
            io_timeout = None
    else:
        found = re.search(r"statement_timeout\s*=\s*(\S+)", str(query.get("options", "")))
        if found is None and not session_settings:
            # (behind a pooler the server's timeout is the role's, as docs/deploying.md has
            # it set: flowkit's own default still bounds the client's waits)
            default = SESSION_DEFAULTS["statement_timeout"]
            statement = _seconds(default) if default is not None else None
        else:
            statement = _seconds(found.group(1)) if found else None
        io_timeout = None if statement is None else statement + IO_MARGIN
    return u.set(query=query), io_timeout


def guarded_connection_class() -> Any:
    """psycopg 3's ``Connection`` whose every wait for the server (a statement, a pipeline's
    sync, a ``COMMIT``) gives up after ``flowkit_io_timeout`` seconds: the connection is then
    closed (its state is unknown) and ``psycopg.OperationalError`` raised, so a stalled link
    fails the call instead of hanging it. ``None`` without psycopg 3."""
    global _guarded
    if _guarded is not None:
        return _guarded
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg2 only
        return None
    wait_timeout: Any = getattr(psycopg.errors, "_WaitTimeout", None)
    if wait_timeout is None:  # pragma: no cover - an older psycopg: no bounded waits
        return None

    class GuardedConnection(psycopg.Connection):
        flowkit_io_timeout: float | None = None

        def wait(self, gen: Any, interval: Any = None, timeout: float | None = None) -> Any:
            mine = timeout is None and self.flowkit_io_timeout is not None
            if mine:
                timeout = self.flowkit_io_timeout
            try:
                if interval is None:
                    return super().wait(gen, timeout=timeout)
                return super().wait(gen, interval, timeout)
            except wait_timeout as exc:
                if not mine:
                    raise
                self.pgconn.finish()  # mid-protocol: nothing more can be read from it
                raise psycopg.OperationalError(
                    f"no answer from the server within {timeout:g} s"
                    f" ({IO_TIMEOUT_PARAM}): connection abandoned"
                ) from exc

    _guarded = GuardedConnection
    return _guarded


_guarded: Any = None


def peer_gone(dbapi: Any) -> bool:
    """Whether an idle psycopg 3 connection is known dead before anything is sent on it: the
    peer reset or closed it, or the server sent an error while it was idle (a ``FATAL`` as it
    ends the session, e.g. on a restart). One non-blocking peek at the socket."""
    pgconn = getattr(dbapi, "pgconn", None)
    if pgconn is None:
        return False
    try:
        if pgconn.transaction_status == 1 or pgconn.pipeline_status:  # ACTIVE, a pipeline
            return False
        fd = pgconn.socket
    except Exception:
        return True
    sock = socket.socket(fileno=fd)
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.detach()
    return data in (b"", b"E")


__all__ = [
    "CONNECT_DEFAULTS",
    "IO_MARGIN",
    "IO_TIMEOUT_PARAM",
    "POOLER_PARAM",
    "SESSION_DEFAULTS",
    "configure_url",
    "guarded_connection_class",
    "peer_gone",
    "take_pooler",
]
