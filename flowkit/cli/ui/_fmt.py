"""How the dashboard shows values: times (ISO-8601 UTC, epoch seconds and a relative text that
app.js keeps fresh, or turns into local time), JSON payloads pretty-printed (escaped by the
templates), durations, and an event's fields as a readable list."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["Field", "ago", "compact", "event_fields", "iso", "offset", "pretty"]


def iso(ts: float) -> str:
    """An epoch time as ISO-8601 UTC to the millisecond (``2026-12-02T07:47:11.250Z``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ago(ts: float, now: float) -> str:
    """``ts`` relative to ``now``: ``just now``, ``3 s ago``, ``2 min ago``, ``in 25 s``."""
    delta = now - ts
    future = delta < 0
    d = abs(delta)
    if d < 1:
        return "just now"
    if d < 60:
        text = f"{int(d)} s"
    elif d < 3600:
        text = f"{int(d // 60)} min"
    elif d < 86400:
        text = f"{int(d // 3600)} h"
    else:
        text = f"{int(d // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def offset(seconds: float) -> str:
    """A time since the first event: ``+0.000s``, ``+1.250s``."""
    if not math.isfinite(seconds):
        return "+?"
    return f"+{max(seconds, 0.0):.3f}s"


def pretty(value: Any) -> str:
    """A payload as indented JSON (anything JSON cannot hold: its ``repr``)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)


def compact(value: Any, width: int = 100) -> str:
    """A payload on one line when it fits in ``width`` characters, else ``pretty``."""
    try:
        line = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(value)
    return line if len(line) <= width else pretty(value)


@dataclass(frozen=True)
class Field:
    """One field of an event as the timeline shows it: ``kind`` is ``time`` (``value`` is
    epoch seconds, shown as a local time by app.js), ``text`` (a string, a number, a bool:
    shown as it is), ``none``, ``error`` (``value``: its one-line headline; ``detail`` the
    whole of it as JSON) or ``json`` (``value``: indented JSON)."""

    name: str
    kind: str
    value: Any
    detail: str = ""


_HIDDEN = frozenset({"seq", "type", "at", "args_digest"})


def event_fields(body: dict[str, Any]) -> list[Field]:
    """The fields of an event (its JSON form, ``events.event_to_json``) worth reading, in
    order: times (``*_at`` fields holding a number) as times, errors by their headline,
    structured payloads as indented JSON, the rest as text. The sequence number, type and time
    are shown apart; ``args_digest`` (a hash) is left out."""
    out = []
    for name, value in body.items():
        if name in _HIDDEN:
            continue
        if value is None:
            out.append(Field(name, "none", None))
        elif name.endswith("_at") and isinstance(value, int | float) and math.isfinite(value):
            out.append(Field(name, "time", float(value)))
        elif name == "error" and isinstance(value, dict):
            head = f"{value.get('type') or 'Error'}: {value.get('message') or ''}".strip()
            out.append(Field(name, "error", head, pretty(value)))
        elif isinstance(value, str | int | float | bool):
            out.append(Field(name, "text", value if isinstance(value, str) else compact(value)))
        elif isinstance(value, list) and all(isinstance(v, str) for v in value) and value:
            out.append(Field(name, "text", ", ".join(value)))
        elif isinstance(value, list | dict) and not value:
            continue  # (an empty list of tags, no attributes: nothing to read)
        else:
            out.append(Field(name, "json", compact(value, 80)))
    return out
