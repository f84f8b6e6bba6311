"""OpenTelemetry for flowkit (docs/observability.md; ``pip install 'flowkit[otel]'``):
``instrument(engine)`` adds a span per run activation and per step attempt, carries the trace
context of ``engine.start``'s caller into the run (stored on its ``run_started``, so every
activation, in any process and after a crash, continues that trace), and records metrics through the
OpenTelemetry metrics API. docs/observability.md lists the spans and metrics.

This is the only module of flowkit that imports ``opentelemetry``; the engine calls it through
the hooks of ``flowkit._core.telemetry`` (none at all when not instrumented)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._client.browse import lanes
from ._core.telemetry import ActivationObserver, StepObserver, guarded
from .stores._capabilities import takes

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

    from ._client.engine import Engine

__all__ = ["OTHER_KEYS", "SCOPE", "Instrumentation", "instrument", "worker_setup"]

SCOPE = "flowkit"
"""The instrumentation scope of flowkit's tracer and meter."""

STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""The bucket edges (seconds) ``flowkit.step.duration`` advises: from 1 ms to a minute (the
SDK's default edges are made for milliseconds: every step under 5 s would share a bucket)."""

WAIT_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    14400.0,
    86400.0,
)
"""The bucket edges (seconds) ``flowkit.singleton.wait`` advises: from 10 ms to a day."""

OTHER_KEYS = "(other)"
"""The ``flowkit.key`` of every singleton key past the ``max_keys`` first ones (with
``per_key_metrics``): their measurements are folded into this one series."""

DEFAULT_MAX_KEYS = 100
"""How many distinct singleton keys get series of their own, by default (``per_key_metrics``)."""


def instrument(
    engine: Engine,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    queue_depth_interval: float = 15.0,
    per_key_metrics: bool = False,
    max_keys: int = DEFAULT_MAX_KEYS,
) -> Instrumentation:
    """Instrument ``engine`` with the global (or given) tracer and meter providers: its runs,
    activations and steps from now on. ``queue_depth_interval``: how often (seconds of the
    engine's clock) the singleton queue depths are read from the store, at most, when a
    metric reader collects them. ``per_key_metrics``: the singleton metrics carry the key
    (``flowkit.key``) for the first ``max_keys`` distinct keys, the others folded into
    ``OTHER_KEYS``; off (the default), they are per workflow only (keys often name
    customers, and each key would be a series). ``Instrumentation.uninstrument()`` undoes
    it."""
    if _MISSING is not None:
        raise ImportError(
            "flowkit.otel needs OpenTelemetry, which is not installed: pip install 'flowkit[otel]'"
        ) from _MISSING
    if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 0:
        raise ValueError(f"max_keys takes a count >= 0, got {max_keys!r}")
    keys = _Keys(max_keys) if per_key_metrics else None
    inst = Instrumentation(engine, tracer_provider, meter_provider, queue_depth_interval, keys)
    # (guarded: an SDK or exporter that raises is logged, never a step's or a run's failure)
    engine.config.telemetry = guarded(inst)
    return inst


DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where ``flowkit worker --metrics-port`` listens unless ``--metrics-host`` says otherwise:
the metrics are served without authentication, so only to this host by default."""


def worker_setup(port: int | None, host: str = DEFAULT_METRICS_HOST) -> WorkerSetup | None:
    """What ``flowkit worker`` instruments its engine with: with ``port``, metrics served
    for Prometheus on ``host``:``port`` (``PrometheusMetricReader`` and prometheus_client's
    HTTP server, started now), and spans by the global tracer provider; without, only when
    an OpenTelemetry SDK was configured (by the app, or ``opentelemetry-instrument``):
    ``None`` otherwise."""
    if _MISSING is not None:
        if port is None:
            return None  # (no SDK can have been configured either: nothing to report to)
        raise ImportError(f"{_MISSING}; pip install 'flowkit[otel]'") from _MISSING
    meter_provider: Any = None
    server: Any = None
    if port is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from prometheus_client import start_http_server

        meter_provider = SdkMeterProvider(metric_readers=[PrometheusMetricReader()])
        server, _thread = start_http_server(port, addr=host)
    elif isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider):
        return None  # (nothing configured: nothing to report to)
    return WorkerSetup(meter_provider, server)


class WorkerSetup:
    """``worker_setup``'s answer: called with the worker's engine, it instruments it.
    ``server``: the metrics HTTP server it started (``None``: none)."""

    def __init__(self, meter_provider: Any, server: Any) -> None:
        self.meter_provider = meter_provider
        self.server = server

    def __call__(self, engine: Engine) -> Instrumentation:
        return instrument(engine, meter_provider=self.meter_provider)

    def close(self) -> None:
        """Stop the metrics server (tests; a worker process just exits)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class _Keys:
    """The ``flowkit.key`` values of one instrumentation (``per_key_metrics``): the first
    ``limit`` distinct ``(workflow, key)`` pairs keep their key, the others are
    ``OTHER_KEYS``, so the series stay bounded whatever the number of keys."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.known: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def label(self, workflow: str, key: str) -> str:
        pair = (workflow, key)
        if pair in self.known:
            return key
        with self._lock:
            if len(self.known) < self.limit:
                self.known.add(pair)
                return key
            return key if pair in self.known else OTHER_KEYS


class Instrumentation:
    """The spans and metrics of one engine (the engine's ``Telemetry``, ``_core/telemetry.py``)."""

    def __init__(
        self,
        engine: Engine,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        queue_depth_interval: float,
        keys: _Keys | None = None,
    ) -> None:
        self.engine = engine
        self.keys = keys  # (None: no ``flowkit.key`` attribute at all)
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
        self.step_duration = _histogram(
            meter,
            "flowkit.step.duration",
            "Duration of each step attempt that ran, by workflow, step and outcome",
            STEP_BUCKETS,
        )
        self.singleton_wait = _histogram(
            meter,
            "flowkit.singleton.wait",
            "Time from a singleton run's creation to its admission",
            WAIT_BUCKETS,
        )
        self.lease_losses = meter.create_counter(
            "flowkit.lease.lost",
            unit="{activation}",
            description="Activations that lost their lease to another instance",
        )
        _depth_gauge(meter).add(self)
        self.queue_depth_interval = queue_depth_interval
        # the depths last read, by attributes (``_lane_attrs``)
        self.depths: dict[tuple[tuple[str, str], ...], int] = {}
        self._reported: set[tuple[tuple[str, str], ...]] = set()
        self._read_at: float | None = None
        self._reading = False
        self._loop: asyncio.AbstractEventLoop | None = None
        with contextlib.suppress(RuntimeError):  # (instrumented outside the engine's loop)
            self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()
        # the start requests' spans, ended when ``engine.start`` ends (``run_started``)
        self._starting: dict[str, list[Span]] = {}
        self.active = True

    def uninstrument(self) -> None:
        """Stop observing the engine: no more spans or measurements from it (the spans of
        activations and steps in flight are ended, nothing more is recorded)."""
        self.active = False
        if getattr(self.engine.config.telemetry, "inner", None) is self:
            self.engine.config.telemetry = None

    # -- the engine's hooks (``_telemetry.Telemetry``) ----------------------------------------
    def start_context(self, workflow: str, run_id: str) -> dict[str, str] | None:
        if not self.active:
            return None
        # a span for the start request, in the caller's trace (a new one outside any span):
        # the run's activations are its children, so one trace holds the whole run. Ended by
        # ``run_started``, which knows whether the run was created.
        span = self.tracer.start_span(
            f"start {workflow}",
            kind=SpanKind.PRODUCER,
            attributes={"flowkit.run_id": run_id, "flowkit.workflow": workflow},
        )
        self._starting.setdefault(run_id, []).append(span)
        carrier: dict[str, str] = {}
        _propagate.inject(carrier, context=_trace.set_span_in_context(span))
        return carrier or None

    def run_started(self, workflow: str, run_id: str, created: bool) -> None:
        spans = self._starting.get(run_id)
        span = spans.pop(0) if spans else None
        if spans is not None and not spans:
            del self._starting[run_id]
        if created and self.active:
            self.runs_started.add(1, {"flowkit.workflow": workflow})
        if span is not None:
            # (an idempotent re-start, or a refused one, is a request that created nothing)
            span.set_attribute("flowkit.created", created)
            span.end()

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
        if self.active:
            self.runs_settled.add(1, {"flowkit.workflow": workflow, "flowkit.status": status})

    def admitted(self, workflow: str, key: str, waited: float) -> None:
        if self.active:
            self.singleton_wait.record(waited, dict(self._lane_attrs(workflow, key)))

    def _lane_attrs(self, workflow: str, key: str) -> tuple[tuple[str, str], ...]:
        """The attributes of a singleton metric of ``key`` of ``workflow``: the workflow,
        and the key only with ``per_key_metrics`` (bounded: ``_Keys``)."""
        if self.keys is None:
            return (("flowkit.workflow", workflow),)
        return (("flowkit.workflow", workflow), ("flowkit.key", self.keys.label(workflow, key)))

    def lease_lost(self, workflow: str | None) -> None:
        if self.active:
            self.lease_losses.add(1, {"flowkit.workflow": workflow or ""})

    # -- queue depth ---------------------------------------------------------------------------
    async def refresh_queue_depth(self) -> None:
        """Read every singleton lane's queue depth from the store now (``flowkit._client.browse``),
        summed by the attributes each is reported with (``_lane_attrs``)."""
        self._reading = True
        try:
            # (every lane: the deepest first, so they are the ones that keep their key)
            found = await lanes(self.engine.store, limit=_ALL_LANES)
        finally:
            self._reading = False
        depths: dict[tuple[tuple[str, str], ...], int] = {}
        for lane in found:
            attrs = self._lane_attrs(lane.workflow, lane.key)
            depths[attrs] = depths.get(attrs, 0) + lane.waiting
        with self._lock:
            self.depths = depths
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
            try:
                loop.call_soon_threadsafe(self._spawn_refresh)
            except RuntimeError:  # (the loop is closing: the next collection tries again)
                self._reading = False
        with self._lock:
            depths = dict(self.depths)
            gone = self._reported - set(depths)
            self._reported = set(depths)
        out = [Observation(n, dict(attrs)) for attrs, n in depths.items()]
        # (a lane that emptied reports 0 once, then nothing)
        out += [Observation(0, dict(attrs)) for attrs in gone]
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


_ALL_LANES = 10**9
"""``lanes``' limit when the queue depths are read: all of them (summed per workflow)."""

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
        if not inst.active:  # (uninstrumented while this activation ran)
            return _IDLE
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

    def context(self) -> dict[str, str] | None:
        carrier: dict[str, str] = {}
        _propagate.inject(carrier, context=self._ctx)
        return carrier or None

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
        if not inst.active:
            return
        inst.step_duration.record(
            max(0.0, inst.clock.now() - self._started),
            {
                "flowkit.workflow": self._workflow,
                "flowkit.step": self._name,
                "flowkit.outcome": outcome,
            },
        )


class _Idle:
    """A step attempt nobody observes any more (the engine was uninstrumented)."""

    def end(self, error: BaseException | None) -> None:
        return None


_IDLE = _Idle()


class _DepthGauge:
    """The ``flowkit.singleton.queue_depth`` gauge of one meter, reporting for every
    instrumentation made with that meter: the SDK registers an instrument once per meter and
    name (a second ``create_observable_gauge`` hands back the first, without the new
    callback), so each instrumentation joins the one callback instead."""

    def __init__(self, meter: Any) -> None:
        self.members: weakref.WeakSet[Instrumentation] = weakref.WeakSet()
        meter.create_observable_gauge(
            "flowkit.singleton.queue_depth",
            callbacks=[self._observe],
            unit="{run}",
            description="Runs waiting for a slot of each singleton key",
        )

    def add(self, inst: Instrumentation) -> None:
        self.members.add(inst)

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        seen: dict[tuple[Any, ...], Observation] = {}
        for inst in list(self.members):
            # (this module's own class: the shared gauge reads each instrumentation)
            for obs in inst._queue_depths(options):  # noqa: SLF001
                seen[tuple(sorted((obs.attributes or {}).items()))] = obs
        return list(seen.values())


_GAUGES: weakref.WeakKeyDictionary[Any, _DepthGauge] = weakref.WeakKeyDictionary()
_GAUGES_LOCK = threading.Lock()


def _depth_gauge(meter: Any) -> _DepthGauge:
    with _GAUGES_LOCK:
        gauge = _GAUGES.get(meter)
        if gauge is None:
            gauge = _GAUGES[meter] = _DepthGauge(meter)
        return gauge


def _histogram(meter: Any, name: str, description: str, buckets: tuple[float, ...]) -> Any:
    """A histogram in seconds that advises ``buckets`` as its edges, when the OpenTelemetry
    API can (``explicit_bucket_boundaries_advisory``: opentelemetry-api 1.30 and later); an
    older one gets the SDK's edges rather than a failed ``instrument``."""
    if takes(meter.create_histogram, "explicit_bucket_boundaries_advisory"):
        return meter.create_histogram(
            name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
        )
    return meter.create_histogram(name, unit="s", description=description)


def _failed(span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
