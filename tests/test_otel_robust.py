"""OpenTelemetry never changes what a run does (``flowkit._core.telemetry.Guarded``): a span
processor or exporter that raises is logged and ignored, never a step's failure, a blocked run
or a failed start; ``uninstrument`` stops the activations in flight from reporting; an
idempotent re-start's request span says it created nothing; every instrumentation on one meter
reports its queue depths."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_app import WORKFLOWS

from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit.events import StepFailed
from flowkit.otel import Instrumentation, instrument
from flowkit_testing import TestEnv


class Boom(SpanProcessor):
    """A span processor with a bug: it raises when a span named ``prefix…`` starts or ends."""

    def __init__(self, when: str, prefix: str) -> None:
        self.when, self.prefix = when, prefix

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.when == "start" and span.name.startswith(self.prefix):
            raise RuntimeError(f"exporter bug on_{self.when}")

    def on_end(self, span: Any) -> None:
        if self.when == "end" and span.name.startswith(self.prefix):
            raise RuntimeError(f"exporter bug on_{self.when}")


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider
    provider.shutdown()


@pytest.mark.parametrize("when", ["start", "end"])
@pytest.mark.parametrize("prefix", ["start", "run", "step"])
async def test_a_failing_span_processor_changes_nothing_in_the_run(
    when: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(Boom(when, prefix))
    try:
        async with TestEnv(WORKFLOWS) as env:
            instrument(env.engines[0], tracer_provider=provider)
            with caplog.at_level(logging.WARNING, logger="flowkit"):
                await env.start("otel-order", {"item": "x", "fails": 0}, "o1")
                await env.run_until_idle()
            assert await env.result("o1") == "reserved x, charged x, x ok"
            history = await env.history("o1")
            run = await env.engines[0].store.get_run("o1")
    finally:
        provider.shutdown()
    assert run is not None and run.status == RunStatus.COMPLETED
    assert not [e for e in history.events if isinstance(e, StepFailed)]
    warned = [r for r in caplog.records if "telemetry hook" in r.getMessage()]
    assert warned, "the failing hook is logged"
    # (each hook's first failure only: a busy worker does not log a traceback per step)
    assert len({r.getMessage() for r in warned}) == len(warned)


INST: list[Instrumentation] = []


async def stop_observing() -> str:
    INST[0].uninstrument()
    return "stopped"


async def afterwards() -> str:
    return "after"


@workflow(name="otel-uninstrumented-midway")
class Midway:
    async def run(self, ctx: WorkflowCtx, _: int) -> str:
        return await ctx.step(stop_observing) + await ctx.step(afterwards)


async def test_uninstrument_stops_the_activations_in_flight(
    spans: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    exporter, provider = spans
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    async with TestEnv([Midway]) as env:
        INST[:] = [instrument(env.engines[0], tracer_provider=provider, meter_provider=meters)]
        await env.start("otel-uninstrumented-midway", 1, "u1")
        await env.run_until_idle()
        assert await env.result("u1") == "stoppedafter"
        assert env.engines[0].config.telemetry is None
    names = [s.name for s in exporter.get_finished_spans()]
    # the spans open when it stopped are ended (nothing leaks), no new one starts
    assert "step afterwards" not in names
    assert "step stop_observing" in names and "run otel-uninstrumented-midway" in names
    data = reader.get_metrics_data()
    metrics = {
        m.name
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert "flowkit.runs.settled" not in metrics
    meters.shutdown()


async def test_an_idempotent_restart_creates_nothing_and_says_so(
    spans: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    exporter, provider = spans
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    async with TestEnv(WORKFLOWS) as env:
        instrument(env.engines[0], tracer_provider=provider, meter_provider=meters)
        await env.start("otel-waits", "a", "r1")
        await env.start("otel-waits", "a", "r1")
    starts = [s for s in exporter.get_finished_spans() if s.name.startswith("start ")]
    assert [dict(s.attributes or {}).get("flowkit.created") for s in starts] == [True, False]
    data = reader.get_metrics_data()
    started = [
        p.value
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "flowkit.runs.started"
        for p in m.data.data_points
    ]
    assert started == [1]
    meters.shutdown()


def _depths(reader: InMemoryMetricReader) -> list[tuple[dict[str, Any], Any]]:
    data = reader.get_metrics_data()
    return [
        (dict(p.attributes or {}), p.value)
        for rm in (data.resource_metrics if data else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "flowkit.singleton.queue_depth"
        for p in m.data.data_points
    ]


LANE = {"flowkit.workflow": "otel-single"}  # (no flowkit.key without per_key_metrics)


async def test_every_instrumentation_on_one_meter_reports_its_queue_depths() -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    async with TestEnv(WORKFLOWS) as first, TestEnv(WORKFLOWS) as second:
        instrument(first.engines[0], meter_provider=meters).uninstrument()
        again = instrument(first.engines[0], meter_provider=meters)  # (re-instrumented)
        other = instrument(second.engines[0], meter_provider=meters)  # (a second engine)
        for env in (first, second):
            await env.start("otel-single", {"key": "k"}, "s1")
            await env.start("otel-single", {"key": "k"}, "s2")
        await again.refresh_queue_depth()
        await other.refresh_queue_depth()
        assert _depths(reader) == [(LANE, 1)]
        await second.cancel("s2")
        await second.run_until_idle()
        await other.refresh_queue_depth()
        again.uninstrument()
        assert _depths(reader) == [(LANE, 0)]
    meters.shutdown()
