"""``MyStore``, the custom store of docs/testing.md's conformance kit examples: here simply a
``SqlStore`` on a SQLite file, which is what a store of yours would replace."""

from __future__ import annotations

import os
import tempfile

from flowkit.stores import SqlStore


class MyStore(SqlStore):
    def __init__(self, path: str) -> None:
        super().__init__(f"sqlite:///{path}")


def new_database() -> str:
    """The path of a fresh, empty database file in the current directory."""
    fd, path = tempfile.mkstemp(prefix="mystore-", suffix=".db", dir=".")
    os.close(fd)
    return os.path.abspath(path)
