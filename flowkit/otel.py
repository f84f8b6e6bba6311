"""OpenTelemetry for flowkit (DESIGN §12; ``pip install 'flowkit[otel]'``): ``instrument(engine)``
adds a span per run activation and per step, carries the trace context of ``engine.start``'s
caller into the run, and records metrics through the OpenTelemetry metrics API."""

from __future__ import annotations

from typing import Any

__all__ = ["instrument"]


def instrument(engine: Any, **options: Any) -> Any:
    """Instrument ``engine`` with the global (or given) tracer and meter providers."""
    raise NotImplementedError("built in fix/otel")
