"""How published events are matched (docs/events.md): a ``ctx.wait_for_event(match=...)`` waiter
receives an event when each of its ``match`` items equals the payload's top-level item of that
key. Stores compare digests of the values (``PublishesEvents``), never the values themselves:
a ``CodecStore``'s payloads stay opaque, and equal JSON values give equal digests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from .serde import dumps

EVENT_MARK_PREFIX = "flowkit:event@"
"""The inbox signal of a delivered published event: ``EVENT_MARK_PREFIX + pos`` (``pos``: the
waiting ``ctx.wait_for_event``'s position). A run parks waiting for it, so a delivery makes the
run due (or the park finds it), and the record of ``event_received`` consumes it."""


def event_mark(pos: str) -> str:
    """The inbox signal name of the event delivered to the wait at ``pos``."""
    return EVENT_MARK_PREFIX + pos


@dataclass(frozen=True)
class TakenEvent:
    """An event a store's ``take_event`` handed to a wait (``PublishesEvents``): its id,
    payload, and the inbox signal (``mark``) the record of ``event_received`` consumes."""

    event_id: str
    payload: Any
    mark: int


def value_digest(value: Any) -> str:
    """The digest of a JSON value (its canonical bytes: sorted keys, no whitespace)."""
    return hashlib.sha256(dumps(value)).hexdigest()[:32]


def payload_keys(payload: Any) -> dict[str, str]:
    """The digests of a (JSON) payload's top-level items; none when it is no object."""
    if not isinstance(payload, dict):
        return {}
    return {str(k): value_digest(v) for k, v in payload.items()}


def match_keys(match: dict[str, Any] | None) -> dict[str, str]:
    """The digests of a waiter's ``match`` (already JSON)."""
    return {str(k): value_digest(v) for k, v in (match or {}).items()}


__all__ = [
    "EVENT_MARK_PREFIX",
    "TakenEvent",
    "event_mark",
    "match_keys",
    "payload_keys",
    "value_digest",
]
