"""Hold a run's row lock from another PostgreSQL connection (another process's transaction
in flight on that run: a signal delivered to it, a batch that writes it) while a store call
runs, and let it go as soon as the call waits for it, or when the call is done.

``RowLock(url, run_id)`` takes the lock at ``__enter__`` (``SELECT ... FOR UPDATE`` in an
open transaction) and a watcher thread commits it once a backend of the server waits for a
lock (``pg_locks``: a transaction that waits for this row), or when the ``with`` block ends.
``waited`` says whether someone waited for it: a store that skipped the row never does."""

from __future__ import annotations

import threading
from types import TracebackType

import psycopg
import sqlalchemy as sa

WAITING = "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'"
"""Backends waiting for another transaction to end: what a row lock wait is."""


def dsn(url: str) -> str:
    """The libpq connection string of a test server's SQLAlchemy ``url``."""
    u = sa.engine.make_url(url)
    return f"host={u.query['host']} user=postgres dbname={u.database}"


class RowLock:
    """The row of ``run_id`` locked by another connection (see the module)."""

    def __init__(self, url: str, run_id: str) -> None:
        self.url = url
        self.run_id = run_id
        self.waited = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RowLock:
        holder = psycopg.connect(dsn(self.url))
        holder.execute("SELECT 1 FROM flowkit_runs WHERE id = %s FOR UPDATE", (self.run_id,))
        watcher = psycopg.connect(dsn(self.url), autocommit=True)

        def watch() -> None:
            try:
                while not self._done.wait(0.002):
                    got = watcher.execute(WAITING).fetchone()
                    if got is not None and got[0]:
                        self.waited = True
                        break
            finally:
                holder.commit()
                holder.close()
                watcher.close()

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        _t: type[BaseException] | None,
        _e: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self._done.set()
        assert self._thread is not None
        self._thread.join(10)
