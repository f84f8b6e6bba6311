"""The singleton gate as the engine sees it: episode bookkeeping over a run's history."""

from __future__ import annotations

import random
from collections.abc import Sequence

from ._history import Event

GATE_RETRY = 1.0
GATE_JITTER = 0.25


def retry_wake_at(now: float, rng: random.Random) -> float:
    """~1 s, jittered ±250 ms from the injected RNG (DESIGN §4.4)."""
    return round(now + GATE_RETRY + rng.uniform(-GATE_JITTER, GATE_JITTER), 6)


def _last_gate_event(events: Sequence[Event]) -> str | None:
    for ev in reversed(events):
        if ev.type in (
            "singleton_gated",
            "singleton_admitted",
            "run_retried",
            "singleton_released",
        ):
            return ev.type
    return None


def needs_gated_event(events: Sequence[Event]) -> bool:
    """True unless this gating episode already recorded ``singleton_gated``."""
    return _last_gate_event(events) != "singleton_gated"


def needs_admitted_event(events: Sequence[Event]) -> bool:
    """True unless the current admission is already recorded (a recovered holder)."""
    return _last_gate_event(events) != "singleton_admitted"
