"""The limits every store keeps, and the checks a store applies before writing (public for
custom stores: docs/stores.md, "Limits").

The engine checks what it writes first (``InvalidInputError`` for a caller's identifiers and
payloads, ``SerializationError`` for values the workflow code produced); these checks are
every store's backstop, so that nothing reaches a database that cannot hold it (a NUL on
PostgreSQL failed every attempt of the write, for ever). Each raises before anything is
written: ``InvalidInputError`` for an identifier, ``SerializationError`` for a payload or an
event text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ERROR_TEXT_LENGTH,
    MAX_EVENT_NAME_LENGTH,
    MAX_NAMESPACE_LENGTH,
    MAX_PATCH_ID_LENGTH,
    MAX_RUN_ID_LENGTH,
    MAX_SIGNAL_NAME_LENGTH,
    MAX_SINGLETON_KEY_LENGTH,
    MAX_TAG_LENGTH,
    MAX_TIMESTAMP,
    MAX_UPDATE_NAME_LENGTH,
    MAX_WORKFLOW_NAME_LENGTH,
    MIN_TIMESTAMP,
    check_identifier,
    check_json,
    error_text,
    text_problem,
)
from .._core.run import SINGLETON_TAG_PREFIX, Run
from ..errors import SerializationError
from ..events import ErrorInfo, Event
from .base import UNSET, Update

PAYLOAD_FIELDS = frozenset({"input", "output", "result", "payload"})
"""The event fields that hold a payload (bounded by ``max_payload_bytes``)."""


def payload_limit(store: Any) -> int:
    """The largest payload ``store`` keeps, in bytes of JSON: its ``max_payload_bytes``; for a
    store that encodes payloads around an inner one (``CodecStore``: base64 of the ciphertext),
    what still fits the inner store once encoded; else ``DEFAULT_MAX_PAYLOAD_BYTES``."""
    limit = getattr(store, "max_payload_bytes", None)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return limit
    inner = getattr(store, "inner", None)
    if inner is not None and getattr(store, "codec", None) is not None:
        return max(0, (payload_limit(inner) - 256) * 3 // 4)
    return DEFAULT_MAX_PAYLOAD_BYTES


def storable(text: Any) -> bool:
    """Whether ``text`` is a string a store can look up (no NUL, no lone surrogate): a
    lookup of any other finds nothing (PostgreSQL would refuse the query itself)."""
    return isinstance(text, str) and (
        (text.isascii() and "\x00" not in text) or text_problem(text) is None
    )


def check_tag(tag: Any, workflow: str | None = None) -> None:
    """A run's tag: a singleton tag's key within ``MAX_SINGLETON_KEY_LENGTH``, any other tag
    within ``MAX_TAG_LENGTH``; neither with NUL."""
    if isinstance(tag, str) and tag.startswith(SINGLETON_TAG_PREFIX):
        key = tag[len(SINGLETON_TAG_PREFIX) :]
        check_identifier("singleton key", key, MAX_SINGLETON_KEY_LENGTH, workflow)
    else:
        check_identifier("tag", tag, MAX_TAG_LENGTH, workflow)


def _check_text(what: str, value: Any) -> None:
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise SerializationError(f"{what} holds {problem}, which no store keeps")


def _check_error(what: str, error: Any) -> None:
    """An error as a run or an event stores it (``ErrorInfo`` or its dict): texts storable."""
    if isinstance(error, ErrorInfo):
        error = error.__dict__
    if isinstance(error, dict):
        for k, v in error.items():
            _check_text(f"{what} {k}", v)


def check_events(events: Sequence[Event], max_bytes: int) -> None:
    """Every payload of ``events`` within ``max_bytes`` and storable; every text (names,
    positions, error messages) without NUL or a lone surrogate; every instant (``at``,
    ``fire_at``, ``retry_at``) between ``MIN_TIMESTAMP`` and ``MAX_TIMESTAMP`` (an infinite
    one was written ``null`` and made the history unreadable)."""
    for ev in events:
        for name, value in ev.__dict__.items():
            if name in PAYLOAD_FIELDS:
                check_json(f"{ev.type} {name}", value, max_bytes)
            elif type(value) is str:
                if not value.isascii() or "\x00" in value:
                    _check_text(f"{ev.type} {name}", value)
            elif type(value) is ErrorInfo:
                _check_error(f"{ev.type} error", value)
            elif type(value) is float:
                if not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:
                    raise SerializationError(f"{ev.type} {name} {value!r} is not an instant")
            elif type(value) is list:
                for item in value:
                    _check_text(f"{ev.type} {name}", item)


def check_run(run: Run, events: Sequence[Event], max_bytes: int) -> None:
    """A new run and its first events (``create_run``), before anything is written."""
    wf = run.workflow if isinstance(run.workflow, str) else None
    check_identifier("run id", run.id, MAX_RUN_ID_LENGTH, wf)
    check_identifier("workflow name", run.workflow, MAX_WORKFLOW_NAME_LENGTH, wf)
    check_identifier("workflow version", run.workflow_version, MAX_WORKFLOW_NAME_LENGTH, wf)
    if run.namespace is not None:
        check_identifier("namespace", run.namespace, MAX_NAMESPACE_LENGTH, wf)
    if run.singleton_key is not None:
        check_identifier("singleton key", run.singleton_key, MAX_SINGLETON_KEY_LENGTH, wf)
    for tag in run.tags:
        check_tag(tag, wf)
    check_json("run input", run.input, max_bytes)
    if run.output is not None:
        check_json("run output", run.output, max_bytes)
    _check_error("run error", run.error)
    check_events(events, max_bytes)


def check_update(update: Update, max_bytes: int) -> None:
    """What ``commit`` writes of ``update`` (its events, output, error, new input, awaited
    signal names), before anything is written."""
    if update.events:
        check_events(update.events, max_bytes)
    if update.output is not UNSET:
        check_json("run output", update.output, max_bytes)
    if update.error is not UNSET:
        _check_error("run error", update.error)
    if update.input is not UNSET:
        check_json("run input", update.input, max_bytes)
    if update.waiting_signals:
        for name in update.waiting_signals:
            check_identifier("signal name", name, MAX_SIGNAL_NAME_LENGTH)
    if update.successor is not None:  # (a continue-as-new: what create_run would check)
        check_run(update.successor.run, update.successor.events, max_bytes)


def check_signal(name: Any, payload: Any, max_bytes: int) -> None:
    """A signal ``deliver_signal`` is about to buffer: its name (``InvalidInputError``) and
    payload (``SerializationError``)."""
    check_identifier("signal name", name, MAX_SIGNAL_NAME_LENGTH)
    check_json("signal payload", payload, max_bytes)


def check_event(name: Any, event_id: Any, payload: Any, max_bytes: int) -> None:
    """An event ``publish_event`` is about to deliver or buffer: its name and id
    (``InvalidInputError``) and payload (``SerializationError``)."""
    check_identifier("event name", name, MAX_EVENT_NAME_LENGTH)
    check_identifier("event_id", event_id, MAX_EVENT_NAME_LENGTH)
    check_json("event payload", payload, max_bytes)


__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_ERROR_TEXT_LENGTH",
    "MAX_EVENT_NAME_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_PATCH_ID_LENGTH",
    "MAX_RUN_ID_LENGTH",
    "MAX_SIGNAL_NAME_LENGTH",
    "MAX_SINGLETON_KEY_LENGTH",
    "MAX_TAG_LENGTH",
    "MAX_UPDATE_NAME_LENGTH",
    "MAX_WORKFLOW_NAME_LENGTH",
    "PAYLOAD_FIELDS",
    "check_event",
    "check_events",
    "check_identifier",
    "check_json",
    "check_run",
    "check_signal",
    "check_tag",
    "check_update",
    "error_text",
    "payload_limit",
    "storable",
]
