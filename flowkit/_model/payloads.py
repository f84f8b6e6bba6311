"""The typed payloads of signals and updates (``@workflow(signals=..., updates=...)``,
docs/updates.md) and the reserved inbox names updates travel under: what ``Engine.signal`` /
``Engine.update`` validate before writing and what the body gets back, live and on replay
(``_replay.waits``, ``_replay.updates``)."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import TypeAdapter

from .._core import limits as _limits
from .._core import serde as _serde

INBOX_PREFIX = "flowkit:update:"
"""The reserved signal names that carry updates into a run's inbox (``inbox_name``)."""


def inbox_name(name: str) -> str:
    """The signal name update ``name`` travels under: the reserved prefix and the name, or
    its digest when both would not fit a signal name (the mapping is fixed, as a run waiting
    for the update parks on it)."""
    full = INBOX_PREFIX + name
    if len(full) <= _limits.MAX_SIGNAL_NAME_LENGTH:
        return full
    return INBOX_PREFIX + "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def payload_adapter(types: dict[str, Any], name: str) -> TypeAdapter[Any] | None:
    """The adapter of the payload type ``types`` (a workflow's ``signals`` or ``updates``)
    declares for ``name``; ``None`` when it declares none (the payload is plain JSON)."""
    tp = types.get(name)
    return None if tp is None else _serde.adapter_for(tp)


def received(types: dict[str, Any], name: str, data: Any) -> Any:
    """What the body gets for a stored payload: ``types[name]`` rebuilt from its JSON (on
    the live path and on replay alike), or the JSON itself when no type is declared."""
    adapter = payload_adapter(types, name)
    return data if adapter is None else _serde.from_json(data, adapter)


__all__ = ["INBOX_PREFIX", "inbox_name", "payload_adapter", "received"]
