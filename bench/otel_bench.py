"""The overhead of OpenTelemetry (issue #23, point 3): the step workload with and without
``flowkit.otel.instrument(engine)``.

Runs of 40 trivial async steps (each step's record one write of its own, as in
``store_bench.py``'s ``LongSteps``), 32 in flight, on ``MemoryStore`` (the engine's own cost,
where the overhead shows most) and on a SQLite file (what a deployment pays). Instrumented: the
SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` in front of an exporter that drops the
spans (the export itself is not flowkit's cost), and the SDK's ``MeterProvider`` with an
``InMemoryMetricReader``: every activation and step attempt makes its span and measurement.
The plain and instrumented rounds alternate (a round each, several times) in one process and
the median of each is compared: printed as steps/s and the ratio instrumented ÷ plain (1.0: no
overhead). Nothing is asserted: other work on the machine skews every figure.

``python bench/otel_bench.py [--smoke]`` (also part of ``bench/run.py``); smoke: 4 runs of 10
steps, one round each."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _results
import store_bench  # noqa: F401  (first: it puts the repository root first on sys.path)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.otel import instrument
from flowkit.stores import MemoryStore, SqlStore

STEPS = 40
RUNS = 200
IN_FLIGHT = 32
ROUNDS = 5


async def bump(i: int) -> int:
    return i + 1


@workflow(name="otel-bench-steps")
class Steps:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        total = 0
        for i in range(n):
            total += await ctx.step(bump, i)
        return total


class Dropped(SpanExporter):
    """Takes every span and keeps none."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


async def one_round(store: Any, traced: bool, runs: int, steps: int) -> tuple[float, int]:
    """Steps per second of ``runs`` runs of ``steps`` steps, ``IN_FLIGHT`` at a time; and the
    spans exported (instrumented)."""
    exporter = Dropped()
    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    async with Engine(store, [Steps()]) as engine:
        if traced:
            instrument(engine, tracer_provider=tp, meter_provider=mp)
        warm = await engine.start("otel-bench-steps", 2)
        await engine.result(warm.id, timeout=60)
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one() -> None:
            async with sem:
                run = await engine.start("otel-bench-steps", steps)
                await engine.result(run.id, timeout=600)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(runs)))
        took = time.perf_counter() - t0
    tp.shutdown()  # (flushes the batch: the spans' count)
    mp.shutdown()
    return runs * steps / took, exporter.count


async def compare(
    name: str, make_store: Callable[[], Any], runs: int, steps: int, rounds: int
) -> dict[str, Any]:
    plain: list[float] = []
    traced: list[float] = []
    spans = 0
    for _ in range(rounds):
        for on in (False, True):
            store = make_store()
            try:
                rate, n = await one_round(store, on, runs, steps)
            finally:
                close = getattr(store, "close", None)
                if close is not None:
                    close()
            (traced if on else plain).append(rate)
            spans = max(spans, n)
    p, t = statistics.median(plain), statistics.median(traced)
    print(
        f"  {name:<7} plain {p:8.0f} steps/s   instrumented {t:8.0f} steps/s   "
        f"ratio {t / p:4.2f}   ({spans} spans a round)"
    )
    return {"plain_steps_s": p, "instrumented_steps_s": t, "ratio": t / p, "spans": spans}


async def main(smoke: bool, tmp: Path) -> dict[str, Any]:
    runs, steps, rounds = (4, 10, 1) if smoke else (RUNS, STEPS, ROUNDS)
    print(
        f"OpenTelemetry overhead: {runs} runs of {steps} steps, {IN_FLIGHT} in flight, "
        f"median of {rounds} alternating rounds (BatchSpanProcessor, spans dropped)"
    )
    out: dict[str, Any] = {"runs": runs, "steps": steps, "rounds": rounds}
    out["memory"] = await compare("memory", MemoryStore, runs, steps, rounds)
    counter = iter(range(1_000_000))
    out["sqlite"] = await compare(
        "sqlite",
        lambda: SqlStore(f"sqlite:///{tmp / f'otel-{next(counter)}.db'}"),
        runs,
        steps,
        rounds,
    )
    return out


if __name__ == "__main__":
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    results = _results.start()
    with tempfile.TemporaryDirectory(prefix="flowkit-otel-bench-") as d:
        results["otel"] = asyncio.run(main(args.smoke, Path(d)))
    _results.finish(results, "otel_smoke.json" if args.smoke else "otel_latest.json")
