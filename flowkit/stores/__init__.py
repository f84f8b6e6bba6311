"""Bundled stores and the store protocol."""

from .base import CommitResult, ConflictError, InboxSignal, Notify, QueueCap, Store, Update
from .memory import MemoryStore
from .sql import SqlStore

__all__ = [
    "CommitResult",
    "ConflictError",
    "InboxSignal",
    "MemoryStore",
    "Notify",
    "QueueCap",
    "SqlStore",
    "Store",
    "Update",
]
