"""Bundled stores and the store protocol."""

from .base import CommitResult, ConflictError, InboxSignal, Notify, QueueCap, Store, Update
from .memory import MemoryStore

__all__ = [
    "CommitResult",
    "ConflictError",
    "InboxSignal",
    "MemoryStore",
    "Notify",
    "QueueCap",
    "Store",
    "Update",
]
