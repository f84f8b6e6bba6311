"""Bundled stores and the store protocol."""

from .base import (
    Admission,
    AdmitsOnCreate,
    AppendsEvents,
    CommitResult,
    ConflictError,
    HandOff,
    InboxSignal,
    NextDueAfter,
    Notify,
    QueueCap,
    Store,
    Update,
)
from .codec import AESGCMCodec, Codec, CodecError, CodecStore
from .memory import MemoryStore
from .sql import SqlStore

__all__ = [
    "AESGCMCodec",
    "Admission",
    "AdmitsOnCreate",
    "AppendsEvents",
    "Codec",
    "CodecError",
    "CodecStore",
    "CommitResult",
    "ConflictError",
    "HandOff",
    "InboxSignal",
    "MemoryStore",
    "NextDueAfter",
    "Notify",
    "QueueCap",
    "SqlStore",
    "Store",
    "Update",
]
