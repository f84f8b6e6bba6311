"""The limits every store keeps, in one place (public as ``flowkit.stores.limits``).

Identifiers (run ids, names, keys, tags) are bounded in length and may not hold NUL or a lone
surrogate (PostgreSQL cannot store NUL in text, nothing can write a lone surrogate as UTF-8).
A payload (an input, output, step result or signal payload) is bounded in size, measured as
its compact JSON in UTF-8, and may not hold NaN, ±inf or NUL anywhere: none of them survives
every store exactly. The engine checks before it writes; stores check again as a backstop
(``flowkit.stores.limits``). docs/stores.md, "Limits", has the table.

Durations and instants have one rule for every call and every store (``duration``,
``timeout``, ``instant``): a duration is seconds (an ``int`` or ``float``) or a
``datetime.timedelta``, never negative or NaN and at most ``MAX_DURATION``; an instant lies
between ``MIN_TIMESTAMP`` and ``MAX_TIMESTAMP`` (what a ``datetime`` can show); a timeout may
also be ``None`` or ``math.inf``, both meaning "no timeout". Bad ones raise
``InvalidInputError`` (a ``ValueError``) at the call, before anything is written
(docs/writing-workflows.md, "Durations and their limits")."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import orjson

from ..errors import InvalidInputError, SerializationError

MAX_RUN_ID_LENGTH = 255
"""Characters of a run id (PostgreSQL's column is ``VARCHAR(255)``)."""
MAX_SINGLETON_KEY_LENGTH = 255
"""Characters of a singleton key (its tag is ``"singleton:" + key``)."""
MAX_TAG_LENGTH = 255
"""Characters of a tag given to ``engine.start``."""
MAX_WORKFLOW_NAME_LENGTH = 255
"""Characters of a workflow name (and of its version)."""
MAX_NAMESPACE_LENGTH = 255
"""Characters of a namespace (and of an engine's instance id)."""
MAX_SIGNAL_NAME_LENGTH = 255
"""Characters of a signal name."""
MAX_UPDATE_NAME_LENGTH = 255
"""Characters of an update name."""
MAX_PATCH_ID_LENGTH = 255
"""Characters of a patch id (``ctx.patched`` / ``ctx.deprecate_patch``)."""
MAX_EVENT_NAME_LENGTH = 255
"""Characters of a published event's name (and of an ``event_set`` key)."""
MAX_ERROR_TEXT_LENGTH = 16384
"""Characters of an error message a history keeps; a longer one is cut (``error_text``)."""
MAX_TIMESTAMP = 253_402_300_799.0
"""The latest instant a timer, deadline or schedule tick may have: 9999-12-31T23:59:59Z (the
last second a ``datetime`` shows)."""
MIN_TIMESTAMP = -62_135_596_800.0
"""The earliest instant ``ctx.sleep_until`` takes: 0001-01-01T00:00:00Z."""
MAX_DURATION = 31_557_600_000.0
"""The longest duration any call takes: 1,000 years of 365.25 days, in seconds."""
MAX_CRON_LENGTH = 255
"""Characters of a schedule's cron expression (PostgreSQL's column is ``VARCHAR(255)``)."""
DEFAULT_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
"""The default largest payload: 4 MiB of compact JSON (``max_payload_bytes`` of the bundled
stores and ``Engine``)."""


def _encodable(s: str) -> bool:
    """``s`` can be written as UTF-8 (it holds no lone surrogate)."""
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def text_problem(s: str) -> str | None:
    """What in the string ``s`` no store can keep (NUL: PostgreSQL refuses it; a lone
    surrogate: not UTF-8), else ``None``."""
    if "\x00" in s:
        return "NUL ('\\x00')"
    if not _encodable(s):
        return "a lone surrogate"
    return None


def identifier_problem(value: Any, max_length: int) -> str | None:
    """Why ``value`` is not a usable identifier (not a non-empty ``str`` of at most
    ``max_length`` characters that every store can hold), else ``None``."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {value!r:.80}"
    if len(value) > max_length:
        return f"is {len(value)} characters long ({value[:40]!r}...); at most {max_length} are kept"
    if value.isascii() and "\x00" not in value:  # (the usual case: one scan)
        return None
    problem = text_problem(value)
    return None if problem is None else f"{value[:80]!r} holds {problem}, which no store keeps"


def check_identifier(what: str, value: Any, max_length: int, workflow: str | None = None) -> None:
    """``InvalidInputError`` (nothing written) naming ``what`` when ``value`` is not a usable
    identifier (``identifier_problem``)."""
    problem = identifier_problem(value, max_length)
    if problem is not None:
        raise InvalidInputError(workflow, f"{what} {problem}")


def value_problem(value: Any, path: str = "$") -> str | None:
    """Where ``value`` (nested lists, tuples and dicts, keys included) holds what no store
    keeps exactly: NaN, ±inf, a string with NUL or a lone surrogate. ``None`` when nothing."""
    t = type(value)
    if t is str or isinstance(value, str):
        problem = text_problem(value)
        return None if problem is None else f"{problem} in a string at {path}"
    if t is float or isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} at {path}"
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                problem = text_problem(k)
                if problem is not None:
                    return f"{problem} in a key at {path}"
            found = value_problem(v, f"{path}[{k!r}]")
            if found is not None:
                return found
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            found = value_problem(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def suspicious(raw: bytes) -> bool:
    """Whether JSON bytes orjson wrote may hide NaN or ±inf (written as ``null``) or hold NUL
    (``\\u0000``): only then is the value walked (``value_problem``)."""
    return b"null" in raw or b"\\u0000" in raw


def size_problem(size: int, max_bytes: int) -> str | None:
    """Why a payload of ``size`` bytes of JSON is refused, else ``None``."""
    if size <= max_bytes:
        return None
    return (
        f"is {size} bytes of JSON; the limit is {max_bytes} (max_payload_bytes, "
        'docs/stores.md "Limits"): store large data elsewhere and pass a reference'
    )


def check_json(what: str, value: Any, max_bytes: int) -> None:
    """``SerializationError`` naming ``what`` when the JSON value ``value`` (what a store is
    about to write) is over ``max_bytes`` or holds NaN, ±inf, NUL or a lone surrogate: the
    stores' backstop (the engine's own check is ``flowkit._core.serde.to_json``)."""
    t = type(value)
    if value is None or t is bool or t is int:
        return
    if t is str and value.isascii() and "\x00" not in value and len(value) * 6 + 2 <= max_bytes:
        return
    try:
        raw = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise SerializationError(f"{what} is not JSON: {exc}") from exc
    problem = size_problem(len(raw), max_bytes)
    if problem is None and suspicious(raw):
        problem = value_problem(value)
        if problem is not None:
            problem = f"holds {problem}, which no store keeps exactly"
    if problem is not None:
        raise SerializationError(f"{what} {problem}")


def duration(
    what: str, value: Any, *, positive: bool = False, workflow: str | None = None
) -> float:
    """``value`` (seconds or a ``datetime.timedelta``) as seconds, checked: finite, >= 0 (> 0
    when ``positive``), at most ``MAX_DURATION``; ``InvalidInputError`` naming ``what``
    otherwise (the one conversion every duration of flowkit goes through)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # (an int too large for a float)
            seconds = math.inf
    else:
        seconds = math.nan
    if seconds != seconds or seconds < 0 or (positive and seconds == 0):
        least = "> 0" if positive else ">= 0"
        raise InvalidInputError(
            workflow, f"{what} takes seconds {least} or a datetime.timedelta, got {value!r:.80}"
        )
    if seconds > MAX_DURATION:
        raise InvalidInputError(
            workflow,
            f"{what} is {value!r:.80}; the longest duration is {MAX_DURATION:.0f} seconds "
            '(1,000 years: docs/writing-workflows.md, "Durations and their limits")',
        )
    return seconds


def timeout(
    what: str, value: Any, *, positive: bool = False, workflow: str | None = None
) -> float | None:
    """A timeout: ``None`` or ``math.inf`` (no timeout) as ``None``, else ``duration``."""
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    return duration(what, value, positive=positive, workflow=workflow)


def instant(what: str, value: Any, workflow: str | None = None) -> float:
    """``value`` (epoch seconds or an aware ``datetime``) as epoch seconds, checked: between
    ``MIN_TIMESTAMP`` and ``MAX_TIMESTAMP``; ``InvalidInputError`` naming ``what`` otherwise."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInputError(
                workflow, f"{what} needs an aware datetime (e.g. tzinfo=UTC), got {value!r}"
            )
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(
            workflow, f"{what} takes epoch seconds or an aware datetime, got {value!r:.80}"
        )
    if not MIN_TIMESTAMP <= value <= MAX_TIMESTAMP:  # (NaN is neither)
        raise InvalidInputError(workflow, f"{what} {value!r:.80} is not an instant {_RANGE}")
    return float(value)


def check_due(what: str, at: float, workflow: str | None = None) -> float:
    """``at`` (an instant computed from a duration: now + seconds), checked as ``instant``
    checks one: ``InvalidInputError`` when it is past ``MAX_TIMESTAMP``."""
    if not at <= MAX_TIMESTAMP:
        raise InvalidInputError(
            workflow, f"{what} would be due at {at!r:.80}, not an instant {_RANGE}"
        )
    return at


_RANGE = (
    "between 0001-01-01 and 9999-12-31T23:59:59Z "
    '(docs/writing-workflows.md, "Durations and their limits")'
)


def error_text(s: str) -> str:
    """``s`` (an exception's message) as every store can keep it: NUL written ``\\x00``, a lone
    surrogate as its escape, and cut to ``MAX_ERROR_TEXT_LENGTH`` characters: a message must
    never make a run unrecordable."""
    if len(s) > MAX_ERROR_TEXT_LENGTH:
        cut = len(s) - MAX_ERROR_TEXT_LENGTH
        s = f"{s[:MAX_ERROR_TEXT_LENGTH]}... ({cut} characters cut)"
    if s.isascii():
        return s.replace("\x00", "\\x00") if "\x00" in s else s
    s = s.replace("\x00", "\\x00")
    return s if _encodable(s) else s.encode("utf-8", "backslashreplace").decode("utf-8")


__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "MAX_CRON_LENGTH",
    "MAX_DURATION",
    "MAX_ERROR_TEXT_LENGTH",
    "MAX_EVENT_NAME_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "MAX_RUN_ID_LENGTH",
    "MAX_SIGNAL_NAME_LENGTH",
    "MAX_SINGLETON_KEY_LENGTH",
    "MAX_TAG_LENGTH",
    "MAX_TIMESTAMP",
    "MAX_UPDATE_NAME_LENGTH",
    "MAX_WORKFLOW_NAME_LENGTH",
    "MIN_TIMESTAMP",
    "check_due",
    "check_identifier",
    "check_json",
    "duration",
    "error_text",
    "identifier_problem",
    "instant",
    "size_problem",
    "suspicious",
    "text_problem",
    "timeout",
    "value_problem",
]
