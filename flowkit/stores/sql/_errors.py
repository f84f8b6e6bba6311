"""What a database error means to flowkit, in one place: ``classify`` sorts a driver's
exception (psycopg, psycopg2, sqlite3, or SQLAlchemy's wrapper of one) into transient, data,
conflict or other; ``translate`` turns it into the typed error a caller sees
(``StoreUnavailableError``, ``SerializationError``, ``ConflictError``) with the original
chained; ``Attempt`` paces the store's own retries of what provably did not commit.

How and why: docs/stores.md, "Timeouts and failures"."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import sqlalchemy as sa

from ...errors import ConflictError, FlowkitError, SerializationError, StoreUnavailableError

TRANSIENT = "transient"  # the database could not serve the call now: try again later
DATA = "data"  # the database refused a value (SQLSTATE class 22, SQLite's TOOBIG...)
CONFLICT = "conflict"  # a unique key already taken (a concurrent writer won)
OTHER = "other"  # anything else the database said: the store cannot serve the call

RETRY_FIRST = 0.02
"""Seconds before the store's first retry of a call that did not commit; doubled each time."""
RETRY_MAX = 0.5
"""The longest pause between two retries."""
RETRY_BUDGET = 2.5
"""Seconds a call (or a connect) keeps retrying before ``StoreUnavailableError``: enough to
absorb a server restart (0.2 to 0.5 s down), short next to a lease."""

_TRANSIENT_STATES = frozenset(
    {
        "40001",  # serialization_failure: the server rolled the transaction back
        "40P01",  # deadlock_detected: idem
        "55P03",  # lock_not_available (lock_timeout)
        "25006",  # read_only_sql_transaction: a standby (a failover in progress)
        "25P03",  # idle_in_transaction_session_timeout: the session was ended
        "25P04",  # transaction_timeout (PostgreSQL 17)
    }
)
_TRANSIENT_CLASSES = frozenset({"08", "53", "57", "58"})  # connection, resources, operator, system
_ENDED_STATES = frozenset({"57P01", "57P02", "57P03"})  # the server ended the session
_PERMANENT_CONNECT = (  # connect failures that waiting does not cure
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "invalid connection option",
    "invalid dsn",
)

# SQLite's primary result codes (``sqlite_errorcode & 0xFF``)
_SQLITE_TRANSIENT = frozenset({5, 6, 7, 10, 13, 15})  # BUSY LOCKED NOMEM IOERR FULL PROTOCOL
_SQLITE_DATA = frozenset({18, 20, 25})  # TOOBIG MISMATCH RANGE
_SQLITE_CONSTRAINT = 19
_SQLITE_UNIQUE = frozenset({1555, 2067})  # CONSTRAINT_PRIMARYKEY, CONSTRAINT_UNIQUE
_SQLITE_READONLY = 8
_SQLITE_CANTOPEN = 14


def root(exc: BaseException) -> BaseException:
    """The driver's exception inside SQLAlchemy's wrapper (``exc`` itself otherwise)."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of ``exc`` (psycopg 3 or psycopg2), ``None`` when the server
    did not say one (a client-side error, a lost connection, SQLite)."""
    e = root(exc)
    state = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    return state if isinstance(state, str) and len(state) == 5 else None


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the database layer (a DBAPI or SQLAlchemy error)."""
    e = root(exc)
    if isinstance(e, sa.exc.SQLAlchemyError | sqlite3.Error):
        return True
    # a DBAPI error of any driver: PEP 249 names its base class ``Error`` in the module
    mod = type(e).__module__.split(".")[0]
    return mod in ("psycopg", "psycopg2", "psycopg_binary", "psycopg_c") and isinstance(
        e, Exception
    )


def classify(exc: BaseException) -> str:
    """``TRANSIENT``, ``DATA``, ``CONFLICT`` or ``OTHER`` for a database error."""
    e = root(exc)
    if isinstance(e, sqlite3.Error):
        return _sqlite_kind(e)
    if isinstance(e, sa.exc.TimeoutError):  # no pooled connection came free in time
        return TRANSIENT
    state = sqlstate(e)
    name = {c.__name__ for c in type(e).__mro__}
    if state is not None:
        cls = state[:2]
        if cls == "22":
            return DATA
        if cls == "23":
            return CONFLICT if state in ("23505", "23P01") else DATA
        if cls in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
            return TRANSIENT
        return OTHER
    if "DataError" in name:  # client side: e.g. psycopg refusing a NUL in a text value
        return DATA
    if "IntegrityError" in name:
        return CONFLICT
    if "ProgrammingError" in name and "adapt" in str(e):  # a value psycopg cannot send
        return DATA
    if "OperationalError" in name or "InterfaceError" in name:
        return TRANSIENT  # a lost or refused connection, a timeout
    return OTHER


def _sqlite_kind(e: sqlite3.Error) -> str:
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(e, sqlite3.IntegrityError) or (code is not None and code & 0xFF == 19):
        if code is None or code in _SQLITE_UNIQUE or "UNIQUE" in str(e):
            return CONFLICT
        return DATA
    if isinstance(e, sqlite3.DataError | sqlite3.InterfaceError):
        return DATA  # a value too big, a parameter it cannot bind
    if isinstance(e, sqlite3.ProgrammingError) and "binding" in str(e):
        return DATA
    if code is not None:
        primary = code & 0xFF
        if primary in _SQLITE_TRANSIENT:
            return TRANSIENT
        if primary in _SQLITE_DATA:
            return DATA
        if primary in (_SQLITE_READONLY, _SQLITE_CANTOPEN):
            return OTHER  # permanent until someone fixes the file's permissions
        return OTHER
    text = str(e)
    if "locked" in text or "disk I/O" in text or "busy" in text:
        return TRANSIENT
    return OTHER


def ended(exc: BaseException) -> bool:
    """The server ended the session before it read the statement (SQLSTATE ``57P01``
    ``admin_shutdown``, ``57P02`` ``crash_shutdown``, ``57P03`` ``cannot_connect_now``)."""
    return sqlstate(exc) in _ENDED_STATES


def rolled_back(exc: BaseException) -> bool:
    """A transient error the server itself reported (it has a SQLSTATE) on a connection that
    is still there: the server rolled the statement (and its transaction) back, so nothing of
    it committed and running it again is safe (``40001``, ``40P01``, ``55P03``, ``57014``...)."""
    return sqlstate(exc) is not None and classify(exc) == TRANSIENT


def permanent_connect_failure(exc: BaseException) -> bool:
    """A connect failure that retrying cannot cure (wrong password, no such database)."""
    text = str(root(exc)).lower()
    return any(p in text for p in _PERMANENT_CONNECT)


def _first_line(exc: BaseException) -> str:
    text = str(root(exc)).strip()
    return text.splitlines()[0] if text else type(root(exc)).__name__


def translate(exc: BaseException, where: str) -> BaseException:
    """The typed error a caller sees for database error ``exc`` (``where`` names the database
    in the message), with ``exc`` chained as its cause; a flowkit error or a non-database
    exception is returned as it is."""
    if isinstance(exc, FlowkitError) or not is_database_error(exc):
        return exc
    kind = classify(exc)
    state = sqlstate(exc)
    detail = _first_line(exc) + (f" (SQLSTATE {state})" if state else "")
    err: FlowkitError
    if kind == DATA:
        err = SerializationError(f"the database {where} refused a value: {detail}")
    elif kind == CONFLICT:
        err = ConflictError(f"the database {where} refused a duplicate: {detail}")
    elif kind == TRANSIENT:
        err = StoreUnavailableError(f"the flowkit database {where} is unavailable: {detail}")
    else:
        err = StoreUnavailableError(f"the flowkit database {where} failed: {detail}")
    err.__cause__ = exc
    return err


class Attempt:
    """One store call's retries: ``pause()`` sleeps before the next try (20 ms, doubling up to
    0.5 s) and says ``False`` once the budget (``RETRY_BUDGET`` seconds since the call began)
    would be spent. (Store I/O, not engine logic: the real monotonic clock.)"""

    def __init__(self, budget: float | None = None) -> None:
        self.n = 0
        self.budget = RETRY_BUDGET if budget is None else budget
        self.started = time.monotonic()  # noqa: TID251 (store I/O, not engine logic)
        self._next = RETRY_FIRST

    def pause(self) -> bool:
        spent = time.monotonic() - self.started  # noqa: TID251
        if spent + self._next > self.budget:
            return False
        time.sleep(self._next)
        self._next = min(self._next * 2, RETRY_MAX)
        self.n += 1
        return True


def attempts(budget: float | None = None) -> Any:
    """``for attempt in attempts():`` the tries of one call: the same ``Attempt`` each time,
    until the loop returns or raises (``Database.retryable`` decides and pauses)."""
    attempt = Attempt(budget)
    while True:
        yield attempt


__all__ = [
    "CONFLICT",
    "DATA",
    "OTHER",
    "RETRY_BUDGET",
    "RETRY_FIRST",
    "RETRY_MAX",
    "TRANSIENT",
    "Attempt",
    "attempts",
    "classify",
    "ended",
    "is_database_error",
    "permanent_connect_failure",
    "rolled_back",
    "root",
    "sqlstate",
    "translate",
]
