"""The encryption marker: how a store knows its payloads are encoded, and refuses plain writes.

A ``CodecStore`` calls ``inner.bind_codec(marker)`` when it wraps a store: payloads written
through that store object come encoded, and the store records ``marker`` (the codec and its
key id, never key material) in its metadata on its first guarded write. A store object that
no ``CodecStore`` bound refuses, on a database carrying the marker, every write that would put
a payload in clear (and ``claim``: executing a run needs its payloads) with
``EncryptedStoreError``, writing nothing. See docs/stores.md, "The encryption marker"."""

from __future__ import annotations

import asyncio
from typing import Any

from ..._core.run import Run
from ...errors import EncryptedStoreError
from ...events import (
    CompensationCompleted,
    CompensationFailed,
    Event,
    EventReceived,
    RunCompleted,
    RunDead,
    RunFailed,
    RunRetried,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
)
from ..base import UNSET, Update

CODEC_META_KEY = "payload_codec"
"""The metadata key of the marker (``flowkit_meta`` on SQL stores)."""

MARKER_MAX = 255
"""Markers are cut to this length (the SQL metadata column's)."""


def event_carries_payload(ev: Event) -> bool:
    """Whether ``ev`` has a field a ``CodecStore`` encodes (a value that is not ``None``)."""
    if isinstance(ev, StepCompleted):
        return ev.result is not None or ev.args_digest is not None
    if isinstance(ev, StepFailed | RunFailed):
        return True  # (the error message)
    if isinstance(ev, RunStarted):
        return ev.input is not None
    if isinstance(ev, SignalReceived | EventReceived):
        return ev.payload is not None
    if isinstance(ev, RunCompleted):
        return ev.output is not None
    if isinstance(ev, RunRetried):
        return ev.new_input and ev.input is not None
    if isinstance(ev, RunDead):
        return ev.error is not None
    if isinstance(ev, CompensationCompleted):
        return ev.result is not None
    return isinstance(ev, CompensationFailed)  # (the error message)


def events_carry_payload(events: Any) -> bool:
    return any(event_carries_payload(e) for e in events)


def update_carries_payload(update: Update) -> bool:
    """Whether committing ``update`` would write a payload."""
    if update.output is not UNSET and update.output is not None:
        return True
    if update.error is not UNSET and update.error is not None:
        return True
    if update.input is not UNSET and update.input is not None:
        return True
    succ = update.successor
    if succ is not None and run_carries_payload(succ.run, succ.events):
        return True
    return events_carry_payload(update.events)


def run_carries_payload(run: Run, events: Any) -> bool:
    """Whether creating ``run`` with ``events`` would write a payload."""
    if run.input is not None or run.output is not None or run.error is not None:
        return True
    return events_carry_payload(events)


class CodecMark:
    """One store object's side of the marker: ``bound`` is the marker of the ``CodecStore``
    writing through it (``None``: a plain store); ``settled`` while nothing is left to check
    (the bound marker is recorded, or a plain store found none). A plain store's "none
    found" holds ``RECHECK`` seconds only (on the event loop's clock): a database encrypted
    meanwhile (a deploy that turns the codec on while plain processes still run) is noticed
    by their next guarded write after that, instead of never."""

    __slots__ = ("_settled", "_until", "bound")

    RECHECK = 30.0

    def __init__(self) -> None:
        self.bound: str | None = None
        self._settled = False
        self._until = 0.0

    @property
    def settled(self) -> bool:
        if not self._settled or self.bound is not None:
            return self._settled
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # (no loop: nothing to re-check against)
            return True
        return now < self._until

    @settled.setter
    def settled(self, value: bool) -> None:
        self._settled = value
        if value:
            try:
                self._until = asyncio.get_running_loop().time() + self.RECHECK
            except RuntimeError:
                self._until = float("inf")

    def bind(self, marker: str) -> None:
        if not isinstance(marker, str) or not marker:
            raise TypeError(f"a codec marker is a non-empty str, got {marker!r}")
        self.bound = marker[:MARKER_MAX]
        self.settled = False


def refuse(found: str, what: str) -> EncryptedStoreError:
    """The error of a plain store asked to ``what`` on a database marked ``found``."""
    return EncryptedStoreError(
        f"cannot {what}: this database's payloads are encrypted ({found}) and this store "
        "writes in clear; open it through a CodecStore with its keys (the flowkit command "
        "line: --codec-keys FILE)",
        marker=found,
    )


__all__ = [
    "CODEC_META_KEY",
    "MARKER_MAX",
    "CodecMark",
    "event_carries_payload",
    "events_carry_payload",
    "refuse",
    "run_carries_payload",
    "update_carries_payload",
]
