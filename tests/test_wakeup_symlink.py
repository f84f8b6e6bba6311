"""The SQLite wake-up watcher on ``inotify`` (issue #24, "idle", found in review): the directory it
watches must be the one SQLite writes (the ``-wal`` file lives next to the database file
SQLite resolved, symlinks followed)."""

from __future__ import annotations

import asyncio
import os
import select
import sys
from pathlib import Path

import pytest
from store_kit import mk, put

from flowkit.stores.sql import SqlStore, _wakeup
from flowkit.stores.sql._inotify import drain


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux only")
@pytest.mark.parametrize("via", ["real path", "symlinked file"])
async def test_the_watcher_is_told_of_a_commit_to_a_symlinked_database(
    tmp_path: Path, via: str
) -> None:
    """A database opened through a symlink to a file in another directory (a common layout:
    ``/srv/app/flowkit.db -> /data/flowkit.db``): SQLite writes ``-wal`` next to the target.
    Another store object's commit must make the watcher's ``inotify`` descriptor readable,
    else every wake-up across processes waits for the ~1 s safety net
    (``SQLITE_IDLE_CHECK``) instead of ~10 ms."""
    data, app = tmp_path / "data", tmp_path / "app"
    data.mkdir()
    app.mkdir()
    real = data / "flowkit.db"
    SqlStore(f"sqlite:///{real}").close()
    opened = real
    if via == "symlinked file":
        opened = app / "flowkit.db"
        os.symlink(real, opened)
    a = SqlStore(f"sqlite:///{opened}")
    unwatch = a.watch(lambda: None)
    other = SqlStore(f"sqlite:///{real}")
    try:
        hub = a._db.hub()
        assert hub is not None
        await asyncio.wait_for(hub.ready.wait(), timeout=10)
        assert isinstance(hub, _wakeup.SqliteHub) and hub._fd is not None
        hub._disarm()  # (nobody drains the descriptor but this test from here on)
        if hub._handle is not None:
            hub._handle.cancel()
        await put(other, mk("x"))  # (creates the -wal file too, before the drain)
        drain(hub._fd)
        await put(other, mk("y"))  # a commit of another store object (another process)
        readable, _, _ = select.select([hub._fd], [], [], 0)
        assert readable, "the watcher's inotify watch never sees the database's writes"
    finally:
        unwatch()
        a.close()
        other.close()
