"""OpenTelemetry for flowkit (DESIGN §12; ``pip install 'flowkit[otel]'``): ``instrument(engine)``
adds a span per run activation and per step attempt, carries the trace context of
``engine.start``'s caller into the run (stored on its ``run_started``, so every activation, in
any process and after a crash, continues that trace), and records metrics through the
OpenTelemetry metrics API. docs/observability.md lists the spans and metrics.

This is the only module of flowkit that imports ``opentelemetry``; the engine calls it through
the hooks of ``flowkit._telemetry`` (none at all when not instrumented)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._browse import lanes
from ._telemetry import ActivationObserver, StepObserver

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # (the extra is not installed: ``instrument`` says so)
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

    from ._engine import Engine

__all__ = ["SCOPE", "Instrumentation", "instrument", "worker_setup"]

SCOPE = "flowkit"
"""The instrumentation scope of flowkit's tracer and meter."""


def instrument(
    engine: Engine,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    queue_depth_interval: float = 15.0,
) -> Instrumentation:
    """Instrument ``engine`` with the global (or given) tracer and meter providers: its runs,
    activations and steps from now on. ``queue_depth_interval``: how often (seconds of the
    engine's clock) the singleton queue depths are read from the store, at most, when a
    metric reader collects them. ``Instrumentation.uninstrument()`` undoes it."""
    if _MISSING is not None:
        raise ImportError(
            "flowkit.otel needs OpenTelemetry, which is not installed: pip install 'flowkit[otel]'"
        ) from _MISSING
    inst = Instrumentation(engine, tracer_provider, meter_provider, queue_depth_interval)
    engine.config.telemetry = inst
    return inst


def worker_setup(port: int | None) -> Callable[[Engine], Instrumentation] | None:
    """What ``flowkit worker`` instruments its engine with: with ``port``, metrics served
    for Prometheus on it (``PrometheusMetricReader`` and prometheus_client's HTTP server,
    started now), and spans by the global tracer provider; without, only when an
    OpenTelemetry SDK was configured (by the app, or ``opentelemetry-instrument``): ``None``
    otherwise."""
    if _MISSING is not None:
        raise ImportError(f"{_MISSING}; pip install 'flowkit[otel]'") from _MISSING
    meter_provider: Any = None
    if port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from prometheus_client import start_http_server

        meter_provider = SdkMeterProvider(metric_readers=[PrometheusMetricReader()])
        start_http_server(port)
    elif isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        return None  # (nothing configured: nothing to report to)

    def setup(engine: Engine) -> Instrumentation:
        return instrument(engine, meter_provider=meter_provider)

    return setup


class Instrumentation:
    """The spans and metrics of one engine (the engine's ``Telemetry``, ``_telemetry.py``)."""

    def __init__(
        self,
        engine: Engine,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        queue_depth_interval: float,
    ) -> None:
        self.engine = engine
        self.clock = engine.config.clock
        self.tracer = _trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = _metrics.get_meter(SCOPE, meter_provider=meter_provider)
        self.runs_started = meter.create_counter(
            "flowkit.runs.started", unit="{run}", description="Runs created, by workflow"
        )
        self.runs_settled = meter.create_counter(
            "flowkit.runs.settled",
            unit="{run}",
            description="Runs that reached a final status (or continued as new), by status",
        )
        self.step_duration = meter.create_histogram(
            "flowkit.step.duration",
            unit="s",
            description="Duration of each step attempt that ran, by workflow, step and outcome",
        )
        self.singleton_wait = meter.create_histogram(
            "flowkit.singleton.wait",
            unit="s",
            description="Time from a singleton run's creation to its admission",
        )
        self.lease_losses = meter.create_counter(
            "flowkit.lease.lost",
            unit="{activation}",
            description="Activations that lost their lease to another instance",
        )
        meter.create_observable_gauge(
            "flowkit.singleton.queue_depth",
            callbacks=[self._queue_depths],
            unit="{run}",
            description="Runs waiting for a slot of each singleton key",
        )
        self.queue_depth_interval = queue_depth_interval
        self.depths: dict[tuple[str, str], int] = {}
        self._reported: set[tuple[str, str]] = set()
        self._read_at: float | None = None
        self._reading = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.active = True

    def uninstrument(self) -> None:
        """Stop observing the engine: no more spans or measurements from it."""
        self.active = False
        if self.engine.config.telemetry is self:
            self.engine.config.telemetry = None

    # -- the engine's hooks (``_telemetry.Telemetry``) ----------------------------------------
    def start_context(self, workflow: str, run_id: str) -> dict[str, str] | None:
        # a span for the start request, in the caller's trace (a new one outside any span):
        # the run's activations are its children, so one trace holds the whole run
        with self.tracer.start_as_current_span(
            f"start {workflow}",
            kind=SpanKind.PRODUCER,
            attributes={"flowkit.run_id": run_id, "flowkit.workflow": workflow},
        ):
            carrier: dict[str, str] = {}
            _propagate.inject(carrier)
        return carrier or None

    def run_started(self, workflow: str) -> None:
        self.runs_started.add(1, {"flowkit.workflow": workflow})

    def activation(
        self, run_id: str, workflow: str, attempt: int, trace: dict[str, str] | None
    ) -> ActivationObserver:
        self._loop = asyncio.get_running_loop()
        # the run's own trace (its start request's), else a trace of its own: never the
        # context that happens to be current in the worker
        parent = _propagate.extract(trace) if trace else _context.Context()
        span = self.tracer.start_span(
            f"run {workflow}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes={
                "flowkit.run_id": run_id,
                "flowkit.workflow": workflow,
                "flowkit.attempt": attempt,
            },
        )
        return _Activation(self, span, run_id, workflow)

    def settled(self, workflow: str, status: str) -> None:
        self.runs_settled.add(1, {"flowkit.workflow": workflow, "flowkit.status": status})

    def admitted(self, workflow: str, key: str, waited: float) -> None:
        self.singleton_wait.record(waited, {"flowkit.workflow": workflow, "flowkit.key": key})

    def lease_lost(self, workflow: str | None) -> None:
        self.lease_losses.add(1, {"flowkit.workflow": workflow or ""})

    # -- queue depth ---------------------------------------------------------------------------
    async def refresh_queue_depth(self) -> None:
        """Read every singleton lane's queue depth from the store now (``flowkit._browse``)."""
        self._reading = True
        try:
            found = await lanes(self.engine.store)
        finally:
            self._reading = False
        with self._lock:
            self.depths = {(lane.workflow, lane.key): lane.waiting for lane in found}
            self._read_at = self.clock.now()

    def _queue_depths(self, options: CallbackOptions) -> Iterable[Observation]:
        """The gauge's callback (in the reader's thread): the depths last read, and a fresh
        read started on the engine's loop when they are older than the interval (the next
        collection sees it)."""
        if not self.active:
            return []
        loop = self._loop
        stale = self._read_at is None or self.clock.now() - self._read_at >= (
            self.queue_depth_interval
        )
        if stale and not self._reading and loop is not None and not loop.is_closed():
            self._reading = True
            with contextlib.suppress(RuntimeError):  # (the loop is closing)
                loop.call_soon_threadsafe(self._spawn_refresh)
        with self._lock:
            depths = dict(self.depths)
            gone = self._reported - set(depths)
            self._reported = set(depths)
        out = [
            Observation(n, {"flowkit.workflow": wf, "flowkit.key": key})
            for (wf, key), n in depths.items()
        ]
        # (a lane that emptied reports 0 once, then nothing)
        out += [Observation(0, {"flowkit.workflow": wf, "flowkit.key": key}) for wf, key in gone]
        return out

    def _spawn_refresh(self) -> None:
        task = asyncio.ensure_future(self._refresh_quietly())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh_queue_depth()
        except Exception:  # (a metric is not worth a failure: the next collection tries again)
            self._reading = False


_tasks: set[asyncio.Future[None]] = set()
"""The queue depth reads in flight (a task needs a reference until it ends)."""


class _Activation:
    """An activation's span; the parent of its step attempts' spans."""

    __slots__ = ("_ctx", "_inst", "_run_id", "_span", "_workflow")

    def __init__(self, inst: Instrumentation, span: Span, run_id: str, workflow: str) -> None:
        self._inst = inst
        self._span = span
        self._ctx = _trace.set_span_in_context(span)
        self._run_id = run_id
        self._workflow = workflow

    def step(self, name: str, attempt: int) -> StepObserver:
        inst = self._inst
        span = inst.tracer.start_span(
            f"step {name}",
            context=self._ctx,
            kind=SpanKind.INTERNAL,
            attributes={
                "flowkit.run_id": self._run_id,
                "flowkit.workflow": self._workflow,
                "flowkit.step": name,
                "flowkit.attempt": attempt,
            },
        )
        # the step's span is the current one while it runs (spans the step makes nest in it)
        token = _context.attach(_trace.set_span_in_context(span))
        return _Step(inst, span, token, self._workflow, name, inst.clock.now())

    def end(self, status: str, error: Any = None) -> None:
        span = self._span
        span.set_attribute("flowkit.status", status)
        if isinstance(error, BaseException):
            _failed(span, error)
        elif error is not None:  # (a failed run's ErrorInfo)
            kind, message = str(error.type), str(error.message)
            span.add_event("exception", {"exception.type": kind, "exception.message": message})
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"))
        elif status == "failed":
            span.set_status(Status(StatusCode.ERROR))
        span.end()


class _Step:
    """One step attempt's span and duration."""

    __slots__ = ("_inst", "_name", "_span", "_started", "_token", "_workflow")

    def __init__(
        self, inst: Instrumentation, span: Span, token: object, workflow: str, name: str, at: float
    ) -> None:
        self._inst = inst
        self._span = span
        self._token = token
        self._workflow = workflow
        self._name = name
        self._started = at

    def end(self, error: BaseException | None) -> None:
        with contextlib.suppress(ValueError, RuntimeError):  # (another context: let it be)
            _context.detach(self._token)  # type: ignore[arg-type]
        span = self._span
        if error is None:
            outcome = "completed"
        elif isinstance(error, Exception):
            outcome = "failed"
            _failed(span, error)
        else:  # (cancelled, or the activation torn down: not the step's failure)
            outcome = "cancelled"
        span.set_attribute("flowkit.outcome", outcome)
        span.end()
        inst = self._inst
        inst.step_duration.record(
            max(0.0, inst.clock.now() - self._started),
            {
                "flowkit.workflow": self._workflow,
                "flowkit.step": self._name,
                "flowkit.outcome": outcome,
            },
        )


def _failed(span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
