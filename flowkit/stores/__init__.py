"""Bundled stores and the store protocol.

``SqlStore`` and the ``CodecStore`` names load on first use, so ``import flowkit`` does not
import SQLAlchemy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..errors import CodecError, ConflictError, EncryptedStoreError
from .base import (
    Admission,
    AdmitsOnCreate,
    AppendsEvents,
    CommitResult,
    ContinuesAsNew,
    HandOff,
    InboxSignal,
    NextDueAfter,
    Notify,
    PrunesRuns,
    PublishedEvent,
    PublishesEvents,
    QueueCap,
    RecordsAdmission,
    ReleasesLeases,
    Store,
    Successor,
    TakenEvent,
    Update,
)
from .memory import MemoryStore
from .schedules import KeepsSchedules, ScheduleRecord

if TYPE_CHECKING:
    from .codec import AESGCMCodec, Codec, CodecStore
    from .sql import SqlStore

_LAZY = {
    "AESGCMCodec": ".codec",
    "Codec": ".codec",
    "CodecStore": ".codec",
    "SqlStore": ".sql",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
    "ContinuesAsNew",
    "EncryptedStoreError",
    "HandOff",
    "InboxSignal",
    "KeepsSchedules",
    "MemoryStore",
    "NextDueAfter",
    "Notify",
    "PrunesRuns",
    "PublishedEvent",
    "PublishesEvents",
    "QueueCap",
    "RecordsAdmission",
    "ReleasesLeases",
    "ScheduleRecord",
    "SqlStore",
    "Store",
    "Successor",
    "TakenEvent",
    "Update",
]
