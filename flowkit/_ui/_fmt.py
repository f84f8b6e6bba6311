"""How the dashboard shows values: times (ISO-8601 UTC, epoch seconds and a relative text that
app.js keeps fresh), JSON payloads pretty-printed (escaped by the templates), durations."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

__all__ = ["ago", "compact", "iso", "offset", "pretty"]


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
