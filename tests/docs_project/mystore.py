"""``MyStore``, the custom store of docs/testing.md's conformance kit examples, which is what a
store of yours would replace: here a ``MemoryStore`` whose data lives under a path, so that
two objects over one path share it as two processes share a database. (The kit runs on
``SqlStore`` over SQLite files in tests/test_conformance.py; in memory the examples take a
second instead of ten.)"""

from __future__ import annotations

import os
import tempfile

from flowkit.stores import MemoryStore
from flowkit.stores.memory import _Data

_DATA: dict[str, _Data] = {}


class MyStore(MemoryStore):
    def __init__(self, path: str) -> None:
        super().__init__(_data=_DATA.setdefault(os.path.abspath(path), _Data()))

    def close(self) -> None:
        """Nothing to release: the data stays for the other objects over its path."""


def new_database() -> str:
    """The path of a fresh, empty database file in the current directory."""
    fd, path = tempfile.mkstemp(prefix="mystore-", suffix=".db", dir=".")
    os.close(fd)
    return os.path.abspath(path)
