"""OpenTelemetry (docs/observability.md, ``flowkit.otel``), in process with the SDK's in-memory
exporters: the span tree of a run (an activation span per activation, a step span per attempt that
ran, with the fixed attributes), retries, failures recorded on spans, no span for a replayed step,
the trace of ``engine.start``'s caller continued by every activation (after a crash too), the
metrics, ``uninstrument``, the trace context in histories and the CLI, and flowkit without
OpenTelemetry installed. On MemoryStore, a SQLite file and PostgreSQL (the ``store``
fixture), in ``TestEnv``. Real worker processes: tests/test_otel_process.py."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otel_app import WORKFLOWS

from flowkit import History, Run, RunStatus, Singleton, WorkflowCtx, WorkflowFailedError, workflow
from flowkit._core.telemetry import onward_tags, trace_of, trace_tags
from flowkit.cli._out import _describe
from flowkit.events import RunStarted
from flowkit.otel import OTHER_KEYS, STEP_BUCKETS, Instrumentation, instrument, worker_setup
from flowkit_testing import TestEnv

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Otel:
    """SDK providers with in-memory exporters."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def instrument(self, engine: Any) -> Instrumentation:
        return instrument(
            engine, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [
            s
            for s in self.spans.get_finished_spans()
            if name is None or s.name == name or s.name.startswith(name + " ")
        ]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value) of each data point of ``metric`` (a histogram's: its count
        and sum, as a pair)."""
        data = self.reader.get_metrics_data()
        out: list[tuple[dict[str, Any], Any]] = []
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != metric:
                        continue
                    for p in m.data.data_points:
                        value = (p.count, p.sum) if hasattr(p, "count") else p.value
                        out.append((dict(p.attributes or {}), value))
        return out


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield Otel(tp, mp, spans, reader)
    tp.shutdown()
    mp.shutdown()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _trace(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.trace_id


async def test_the_span_tree_of_a_run_with_a_retried_step(store: Any, otel: Otel) -> None:
    item = f"box-{uuid.uuid4().hex[:8]}"
    async with TestEnv(WORKFLOWS, store=store) as env:
        otel.instrument(env.engines[0])
        tracer = otel.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("request") as request:
            await env.start("otel-order", {"item": item, "fails": 2}, "o1")
        await env.run_until_idle()
        assert await env.result("o1") == f"reserved {item}, charged {item}, {item} ok"
        history = await env.history("o1")
    first = history.events[0]
    stored = trace_of([first])
    assert isinstance(first, RunStarted) and stored is not None
    assert stored["traceparent"].split("-")[1] == f"{request.get_span_context().trace_id:032x}"

    runs = otel.finished("run")
    steps = otel.finished("step")
    assert [s.name for s in steps] == [
        "step reserve",
        "step charge",
        "step ship",
        "step ship",
        "step ship",
    ]
    # one trace: the start request's
    trace_id = request.get_span_context().trace_id
    assert {_trace(s) for s in [*runs, *steps]} == {trace_id}
    # the start span is the request's child, every activation the start span's, every step
    # its activation's
    (start,) = otel.finished("start")
    assert start.parent is not None
    assert start.parent.span_id == request.get_span_context().span_id
    assert _attrs(start) == {
        "flowkit.run_id": "o1",
        "flowkit.workflow": "otel-order",
        "flowkit.created": True,
    }
    assert start.kind is SpanKind.PRODUCER and _trace(start) == trace_id
    assert start.context is not None
    assert all(s.parent is not None and s.parent.span_id == start.context.span_id for s in runs)
    run_ids = {s.context.span_id for s in runs if s.context is not None}
    assert all(s.parent is not None and s.parent.span_id in run_ids for s in steps)
    # three activations: suspended for each retry's backoff, then completed
    assert [_attrs(s)["flowkit.status"] for s in runs] == ["suspended", "suspended", "completed"]
    for s in runs:
        assert s.name == "run otel-order" and s.kind is SpanKind.CONSUMER
        a = _attrs(s)
        assert (a["flowkit.run_id"], a["flowkit.workflow"], a["flowkit.attempt"]) == (
            "o1",
            "otel-order",
            1,
        )
    ships = [_attrs(s) for s in steps if s.name == "step ship"]
    assert [a["flowkit.attempt"] for a in ships] == [1, 2, 3]
    assert all(a["flowkit.run_id"] == "o1" and a["flowkit.step"] == "ship" for a in ships)
    assert [a["flowkit.outcome"] for a in ships] == ["failed", "failed", "completed"]
    failed = [s for s in steps if s.name == "step ship"][:2]
    for s in failed:
        assert s.status.status_code is StatusCode.ERROR
        (event,) = [e for e in s.events if e.name == "exception"]
        assert dict(event.attributes or {})["exception.type"] == "ConnectionError"
    assert steps[-1].status.status_code is StatusCode.UNSET


async def test_a_failed_step_and_run_are_errors(store: Any, otel: Otel) -> None:
    async with TestEnv(WORKFLOWS, store=store) as env:
        otel.instrument(env.engines[0])
        await env.start("otel-fail", "tea", "f1")
        with pytest.raises(WorkflowFailedError):
            await env.result("f1")
    (step,) = otel.finished("step explode")
    assert step.status.status_code is StatusCode.ERROR
    assert "ValueError: no tea" in (step.status.description or "")
    (exc,) = [e for e in step.events if e.name == "exception"]
    assert dict(exc.attributes or {})["exception.message"] == "no tea"
    (run,) = otel.finished("run")
    assert run.status.status_code is StatusCode.ERROR
    assert _attrs(run)["flowkit.status"] == "failed"
    assert any(e.name == "exception" for e in run.events)
    assert otel.points("flowkit.runs.settled") == [
        ({"flowkit.workflow": "otel-fail", "flowkit.status": "failed"}, 1)
    ]


async def test_a_replayed_step_gets_no_second_span(store: Any, otel: Otel) -> None:
    async with TestEnv(WORKFLOWS, store=store) as env:
        otel.instrument(env.engines[0])
        await env.start("otel-waits", "pen", "w1")
        assert [s.name for s in otel.finished("step")] == ["step reserve"]
        await env.signal("w1", "go")
        assert await env.result("w1") == "reserved pen, charged pen"
    # the second activation replayed ``reserve`` from the history: no span for it
    assert [s.name for s in otel.finished("step")] == ["step reserve", "step charge"]
    assert [_attrs(s)["flowkit.status"] for s in otel.finished("run")] == [
        "suspended",
        "completed",
    ]
    # a run started outside any span has a trace of its own, shared by its activations
    assert len({_trace(s) for s in otel.spans.get_finished_spans()}) == 1


async def test_the_trace_continues_after_a_crash(store: Any, otel: Otel) -> None:
    async with TestEnv(WORKFLOWS, store=store, instances=2) as env:
        for eng in env.engines:
            otel.instrument(eng)
        env.crash_at(0, "after_step_record")
        tracer = otel.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("request") as request:
            await env.engines[0].start("otel-order", {"item": "crash", "fails": 0}, "c1")
        await env.settle()
        assert env.crashed == [0]
        await env.advance(env.lease_ttl + 1)  # the lease expires: instance 1 takes the run
        await env.run_until_idle()
        assert await env.result("c1") == "reserved crash, charged crash, crash ok"
    trace_id = request.get_span_context().trace_id
    spans = otel.finished("run") + otel.finished("step")
    assert {_trace(s) for s in spans} == {trace_id}
    # the recovering activation's span has the same parent: the start span, from the history
    (start,) = otel.finished("start")
    assert start.context is not None
    completed = [s for s in otel.finished("run") if _attrs(s)["flowkit.status"] == "completed"]
    assert len(completed) == 1
    assert completed[0].parent is not None
    assert completed[0].parent.span_id == start.context.span_id
    assert "step ship" in [s.name for s in otel.finished("step")]


def _bump(n: int) -> int:
    return n + 1


@workflow(name="otel-counter")
class _Counter:
    """Counts to 3, continuing as new after each step."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        n = await ctx.step(_bump, n, name="bump")
        if n < 3:
            ctx.continue_as_new(n)
        return n


@workflow(name="otel-parent")
class _Parent:
    """Awaits one child (which continues as new twice)."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return int(await ctx.child(_Counter, n))


async def test_children_and_successors_join_the_trace(store: Any, otel: Otel) -> None:
    """A child run and each continue-as-new successor continue the trace of the run that
    started them: every span shares the request's trace, a child's activations are children
    of the parent's activation that started it, a successor's of its predecessor's."""
    async with TestEnv([_Parent, _Counter], store=store) as env:
        otel.instrument(env.engines[0])
        with otel.tracer_provider.get_tracer("test").start_as_current_span("request") as req:
            await env.start("otel-parent", 0, "tp")
        assert await env.result("tp") == 3
    trace_id = req.get_span_context().trace_id
    runs = otel.finished("run")
    by_run: dict[str, list[ReadableSpan]] = {}
    for s in runs:
        by_run.setdefault(_attrs(s)["flowkit.run_id"], []).append(s)
    assert set(by_run) == {"tp", "tp.child.1", "tp.child.1~1", "tp.child.1~2"}
    assert {_trace(s) for s in otel.finished()} == {trace_id}

    def span_ids(run_id: str) -> set[int]:
        return {s.context.span_id for s in by_run[run_id] if s.context is not None}

    for run_id, starter in (
        ("tp.child.1", "tp"),
        ("tp.child.1~1", "tp.child.1"),
        ("tp.child.1~2", "tp.child.1~1"),
    ):
        for s in by_run[run_id]:
            assert s.parent is not None and s.parent.span_id in span_ids(starter), run_id
        assert trace_of(await store.load_events(run_id)) is not None


async def _recovered_parent(store: Any, otel: Otel | None) -> dict[str, str]:
    """Run ``otel-parent`` on two instances, instance 0 crashing once its child exists and
    before it recorded ``child_started`` (instance 1 recovers the parent): every history,
    without its trace tags, as JSON."""
    async with TestEnv([_Parent, _Counter], store=store, instances=2) as env:
        if otel is not None:
            for eng in env.engines:
                otel.instrument(eng)
        env.crash_at(0, "after_child_create")
        await env.engines[0].start("otel-parent", 0, "rp")
        await env.settle()
        assert env.crashed == [0]
        await env.advance(env.lease_ttl + 1)  # (instance 1 takes the parent over)
        assert await env.result("rp") == 3
        out = {}
        for run_id in ("rp", "rp.child.1", "rp.child.1~1", "rp.child.1~2"):
            events = (await env.history(run_id)).events
            if otel is not None:
                assert trace_of(events) is not None, run_id
            first = events[0].model_copy(
                update={"tags": [t for t in events[0].tags if not t.startswith("flowkit:trace:")]}
            )
            out[run_id] = History(run_id, [first, *events[1:]]).to_json()
    return out


async def test_a_recovered_parent_keeps_one_child_in_one_trace(otel: Otel) -> None:
    """A parent that crashed after creating its child replays its start on another
    instance: still one child, in the trace the crashed activation handed it, and every
    history (trace tags aside) as an uninstrumented run of the same writes it."""
    from flowkit.stores import MemoryStore

    traced = await _recovered_parent(MemoryStore(), otel)
    assert traced == await _recovered_parent(MemoryStore(), None)
    runs = otel.finished("run")
    assert len({_trace(s) for s in otel.finished()}) == 1
    # the child's activation is a child of the parent's crashed activation (which started
    # it), not of the recovering one (whose replay found it started)
    statuses = {(_attrs(s)["flowkit.run_id"], _attrs(s)["flowkit.status"]): s for s in runs}
    crashed = statuses["rp", "lost"]
    [child] = [s for s in runs if _attrs(s)["flowkit.run_id"] == "rp.child.1"]
    assert crashed.context is not None and child.parent is not None
    assert child.parent.span_id == crashed.context.span_id


def test_a_run_started_by_an_unobserved_activation_keeps_its_starters_trace() -> None:
    """A worker that is not instrumented still hands the trace its run carries on to the
    runs it starts (``onward_tags``); with no trace, it hands none."""
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    traced = RunStarted(seq=1, workflow="w", version="1", tags=trace_tags(carrier))
    assert onward_tags(None, [traced]) == trace_tags(carrier)
    assert onward_tags(None, [RunStarted(seq=1, workflow="w", version="1")]) == []


def _fragile(n: int) -> int:
    return n


@workflow(name="otel-fragile", max_recovery_attempts=0)
class _Fragile:
    """Dead at its first lost activation."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(_fragile, n, name="record")


@workflow(name="otel-timed", singleton=Singleton(key=lambda _: "k"), execution_timeout=3600)
class _Timed:
    """Holds its key until signalled, for an hour at most."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return int(await ctx.wait_for_signal("go"))


async def test_runs_settled_without_an_activation_are_counted(store: Any, otel: Otel) -> None:
    """``flowkit.runs.settled`` counts the runs that settle with no activation of theirs:
    dead at a claim, cancelled at once at their deadline or by ``engine.cancel`` (a waiter
    behind its key's holder)."""
    async with TestEnv([_Fragile, _Timed], store=store, instances=2) as env:
        otel.instrument(env.engines[0])
        otel.instrument(env.engines[1])
        env.crash_at(0, "before_step_record", times=None)
        await env.start("otel-fragile", 1, "f")
        assert env.crashed == [0]
        await env.advance(31)  # (instance 0's lease expired: instance 1 claims the run)
        assert (await env.get_run("f")).status is RunStatus.DEAD
        await env.start("otel-timed", 1, "holder")
        await env.start("otel-timed", 2, "late")  # (waits behind the holder)
        await env.start("otel-timed", 3, "dropped")
        await env.cancel("dropped")
        await env.advance(3601)  # the holder is cancelled in its body, "late" at once
        assert [(await env.get_run(r)).status for r in ("holder", "late", "dropped")] == [
            RunStatus.CANCELLED
        ] * 3
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {("otel-fragile", "dead"): 1, ("otel-timed", "cancelled"): 3}


@workflow(name="otel-hop", singleton=Singleton(key=lambda inp: inp["key"]))
class _Hop:
    """Holds its key until signalled; with ``hop``, first continues as new on key ``g``."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        if input["hop"]:
            ctx.continue_as_new({"key": "g", "hop": False})
        await ctx.wait_for_signal("done")
        return "ok"


async def test_a_run_cancelled_at_its_gate_is_counted_once(store: Any, otel: Otel) -> None:
    """A successor on a key another run holds goes through the gate leased; a cancellation
    landing during its admission check settles it ``cancelled`` there, with no activation of
    its own: counted once in ``flowkit.runs.settled`` (the request found it leased, so it
    only asked)."""
    async with TestEnv([_Hop], store=store) as env:
        otel.instrument(env.engines[0])
        await env.start("otel-hop", {"key": "g", "hop": False}, "holder")
        check = store.try_admit_singleton
        asked: list[Run] = []

        @functools.wraps(check)
        async def cancel_meanwhile(run_id: str, *args: Any, **kwargs: Any) -> Any:
            ok = await check(run_id, *args, **kwargs)
            if run_id == "hop~1" and not asked:
                asked.append(await env.engines[0].cancel(run_id))
            return ok

        store.try_admit_singleton = cancel_meanwhile
        await env.start("otel-hop", {"key": "h", "hop": True}, "hop")
        await env.run_until_idle()
        assert [r.status for r in asked] == [RunStatus.CANCELLING]
        assert (await env.get_run("hop~1")).status is RunStatus.CANCELLED
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {("otel-hop", "continued"): 1, ("otel-hop", "cancelled"): 1}


async def test_a_continuation_that_fails_is_counted_failed(store: Any, otel: Otel) -> None:
    """A ``continue_as_new`` whose successor cannot be made (its id is another run's) fails
    the run: ``flowkit.runs.settled`` counts it ``failed``, not ``continued``, and its
    activation span says so."""
    async with TestEnv([_Hop], store=store) as env:
        otel.instrument(env.engines[0])
        await env.start("otel-hop", {"key": "x", "hop": False}, "taken~1")  # (the id taken)
        await env.start("otel-hop", {"key": "h", "hop": True}, "taken")
        await env.run_until_idle()
        assert (await env.get_run("taken")).status is RunStatus.FAILED
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {("otel-hop", "failed"): 1}
    [span] = [s for s in otel.finished("run") if _attrs(s)["flowkit.run_id"] == "taken"]
    assert _attrs(span)["flowkit.status"] == "failed"
    assert span.status.status_code is StatusCode.ERROR


async def test_a_continuation_a_cancel_overtakes_is_counted_once(store: Any, otel: Otel) -> None:
    """A cancellation landing while a ``continue_as_new`` commits wins: the run is given
    back and settles ``cancelled`` in its next activation. ``flowkit.runs.settled`` counts
    it once, ``cancelled`` (not ``continued`` as well)."""
    async with TestEnv([_Counter], store=store) as env:
        otel.instrument(env.engines[0])
        commit = store.commit
        asked: list[Run] = []

        @functools.wraps(commit)
        async def cancel_first(run_id: str, *args: Any, **kwargs: Any) -> Any:
            update = args[-1] if args else kwargs.get("update")
            if run_id == "c" and getattr(update, "successor", None) is not None and not asked:
                asked.append(await env.engines[0].cancel("c"))  # (leased: it only asks)
            return await commit(run_id, *args, **kwargs)

        store.commit = cancel_first
        await env.start("otel-counter", 1, "c")
        await env.run_until_idle()
        assert [r.status for r in asked] == [RunStatus.CANCELLING]
        run = await env.get_run("c")
        assert run.status is RunStatus.CANCELLED and run.continued_as is None
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {("otel-counter", "cancelled"): 1}


async def test_a_run_failed_after_its_store_refused_it_is_counted(store: Any, otel: Otel) -> None:
    """A run whose terminal commit the store keeps refusing (a ``SerializationError``) is
    failed once the worker gives up, after its activations ended unsettled: counted once,
    ``failed``, in ``flowkit.runs.settled``."""
    from faulty_store import FaultyStore

    from flowkit.errors import SerializationError
    from flowkit.stores.base import Update

    faulty = FaultyStore(store)

    def completes(args: tuple[Any, ...]) -> bool:
        update = args[3] if len(args) > 3 else None
        return isinstance(update, Update) and update.status is RunStatus.COMPLETED

    async with TestEnv([_Fragile], store=faulty) as env:
        otel.instrument(env.engines[0])
        faulty.fail(
            "commit",
            times=None,
            match=completes,
            error=lambda: SerializationError("output cannot be stored"),
        )
        await env.start("otel-fragile", 1, "refused")
        await env.run_until_idle()
        assert (await env.get_run("refused")).status is RunStatus.FAILED
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {("otel-fragile", "failed"): 1}


async def test_metrics(store: Any, otel: Otel) -> None:
    async with TestEnv(WORKFLOWS, store=store) as env:
        inst = otel.instrument(env.engines[0])
        await env.start("otel-order", {"item": f"m-{uuid.uuid4().hex[:6]}"}, "m1")
        await env.start("otel-fail", "x", "m2")
        await env.start("otel-single", {"key": "k"}, "s1")
        await env.start("otel-single", {"key": "k"}, "s2")  # queued behind s1
        await inst.refresh_queue_depth()
        # (no singleton key in any attribute: keys often name customers)
        assert otel.points("flowkit.singleton.queue_depth") == [
            ({"flowkit.workflow": "otel-single"}, 1)
        ]
        await env.advance(7)
        await env.signal("s1", "done")
        await env.run_until_idle()
        assert await env.result("s1") == "reserved k"
        await inst.refresh_queue_depth()
        # (an emptied lane reports 0 once)
        assert otel.points("flowkit.singleton.queue_depth") == [
            ({"flowkit.workflow": "otel-single"}, 0)
        ]
    started = dict((p[0]["flowkit.workflow"], p[1]) for p in otel.points("flowkit.runs.started"))
    assert started == {"otel-order": 1, "otel-fail": 1, "otel-single": 2}
    settled = {
        (a["flowkit.workflow"], a["flowkit.status"]): v
        for a, v in otel.points("flowkit.runs.settled")
    }
    assert settled == {
        ("otel-order", "completed"): 1,
        ("otel-fail", "failed"): 1,
        ("otel-single", "completed"): 1,
    }
    durations = {
        (a["flowkit.workflow"], a["flowkit.step"], a["flowkit.outcome"]): v
        for a, v in otel.points("flowkit.step.duration")
    }
    assert durations[("otel-order", "ship", "completed")][0] == 1
    assert durations[("otel-fail", "explode", "failed")][0] == 1
    assert durations[("otel-single", "reserve", "completed")][0] == 1  # (s2 still waits)
    assert len(durations) == 6
    # the singleton wait: s1 admitted at once, s2 after 7 s of the virtual clock
    ((attrs, (count, total)),) = otel.points("flowkit.singleton.wait")
    assert attrs == {"flowkit.workflow": "otel-single"}
    assert count == 2 and total == pytest.approx(7.0, abs=0.5)
    for metric in _METRICS:
        for attrs, _ in otel.points(metric):
            assert "flowkit.key" not in attrs and "k" not in attrs.values(), (metric, attrs)


_METRICS = (
    "flowkit.runs.started",
    "flowkit.runs.settled",
    "flowkit.step.duration",
    "flowkit.singleton.wait",
    "flowkit.singleton.queue_depth",
    "flowkit.lease.lost",
)


async def test_per_key_metrics_are_opt_in_and_bounded(otel: Otel) -> None:
    """With ``per_key_metrics``, the singleton metrics carry the key of the first
    ``max_keys`` distinct keys; the others are folded into one ``OTHER_KEYS`` series."""
    async with TestEnv(WORKFLOWS) as env:
        inst = instrument(
            env.engines[0],
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            per_key_metrics=True,
            max_keys=2,
        )
        for key in ("a", "b", "c", "d"):
            for n in (1, 2):  # (the second waits behind the first)
                await env.start("otel-single", {"key": key}, f"{key}{n}")
        await inst.refresh_queue_depth()
        depths = {a["flowkit.key"]: v for a, v in otel.points("flowkit.singleton.queue_depth")}
        assert len(depths) == 3 and depths[OTHER_KEYS] == 2, depths
        assert sum(depths.values()) == 4
        waits = {a["flowkit.key"]: v[0] for a, v in otel.points("flowkit.singleton.wait")}
        assert waits == {**{k: 1 for k in depths if k != OTHER_KEYS}, OTHER_KEYS: 2}
    with pytest.raises(ValueError, match="max_keys"):
        instrument(env.engines[0], per_key_metrics=True, max_keys=-1)


def test_the_step_duration_buckets_are_seconds() -> None:
    """``flowkit.step.duration`` advises bucket edges from 1 ms to a minute: steps of 2 ms,
    40 ms and 700 ms land in different buckets (the SDK's default edges put every one in
    its first bucket above 0)."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    inst = Instrumentation(_FakeEngine(), None, mp, 15.0)  # type: ignore[arg-type]
    for seconds in (0.002, 0.04, 0.7):
        inst.step_duration.record(seconds, {"flowkit.step": "s"})
    data = reader.get_metrics_data()
    assert data is not None
    [point] = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "flowkit.step.duration"
        for p in m.data.data_points
    ]
    assert tuple(point.explicit_bounds) == STEP_BUCKETS
    assert STEP_BUCKETS[0] == 0.001 and STEP_BUCKETS[-1] == 60.0
    assert sum(1 for n in point.bucket_counts if n) == 3
    mp.shutdown()


def test_an_api_without_bucket_advice_still_instruments() -> None:
    """An OpenTelemetry API older than the bucket advice (``opentelemetry-api`` < 1.30, which
    ``flowkit[otel]`` allows: its ``create_histogram`` takes no
    ``explicit_bucket_boundaries_advisory``) still instruments an engine: the histograms
    keep the SDK's edges instead of failing ``instrument``."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])

    class OldMeter:
        """A meter whose ``create_histogram`` has the signature of opentelemetry-api 1.29."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def create_histogram(self, name: str, unit: str = "", description: str = "") -> Any:
            return self._inner.create_histogram(name, unit, description)

    class OldProvider:
        def get_meter(self, *args: Any, **kwargs: Any) -> Any:
            return OldMeter(mp.get_meter(*args, **kwargs))

    inst = Instrumentation(_FakeEngine(), None, OldProvider(), 15.0)  # type: ignore[arg-type]
    inst.step_duration.record(0.5, {"flowkit.step": "s"})
    data = reader.get_metrics_data()
    assert data is not None
    names = [m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    assert "flowkit.step.duration" in names
    mp.shutdown()


class _FakeEngine:
    """What ``Instrumentation`` reads of an engine: its config's clock."""

    class config:
        clock = None
        telemetry = None


async def test_uninstrument_stops_it(otel: Otel) -> None:
    async with TestEnv(WORKFLOWS) as env:
        inst = otel.instrument(env.engines[0])
        await env.start("otel-waits", "a", "u1")
        inst.uninstrument()
        assert env.engines[0].config.telemetry is None
        await env.signal("u1", "go")
        await env.start("otel-fail", "b", "u2")
        await env.run_until_idle()
    assert [s.name for s in otel.finished("step")] == ["step reserve"]
    assert len(otel.finished("run")) == 1  # (the suspended activation, before)
    assert otel.points("flowkit.runs.settled") == []
    assert otel.points("flowkit.runs.started") == [({"flowkit.workflow": "otel-waits"}, 1)]


def test_the_trace_context_in_history_json_and_the_cli() -> None:
    carrier = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    tags = ["singleton:k", *trace_tags(carrier)]
    with_trace = RunStarted(seq=1, workflow="w", version="1", tags=tags)
    without = RunStarted(seq=1, workflow="w", version="1", tags=["singleton:k"])
    assert trace_of([with_trace]) == carrier and trace_of([without]) is None
    h = History("r", [with_trace])
    assert History.from_json(h.to_json()).to_json() == h.to_json()
    assert History.from_json(h.to_json()).events[0] == with_trace
    assert "trace 4bf92f3577b34da6a3ce929d0e0e4736" in _describe(with_trace, 0.0)
    assert "trace" not in _describe(without, 0.0)
    assert "flowkit:" not in _describe(with_trace, 0.0)  # (reserved tags are not shown as tags)
    golden = History.from_json((ROOT / "tests/histories/greeting-traced.json").read_bytes())
    assert trace_of(golden.events) is not None


def test_a_traced_history_has_only_fields_every_flowkit_reads() -> None:
    """The trace context rides in reserved tags, not a field of its own: a worker of the
    previous flowkit (whose events refuse unknown fields) reads a history an instrumented
    starter wrote, during a rolling upgrade."""
    golden = json.loads((ROOT / "tests/histories/greeting-traced.json").read_bytes())
    first = golden["events"][0]
    assert set(first) == {"type", "seq", "at", "workflow", "version", "input", "tags"}


BLOCKED = textwrap.dedent(
    """
    import asyncio, sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import flowkit
    from flowkit import Engine, WorkflowCtx, workflow
    from flowkit.stores import MemoryStore

    @workflow(name="plain")
    class Plain:
        async def run(self, ctx: WorkflowCtx, n: int) -> int:
            return await ctx.step(lambda: n + 1, name="inc")

    async def main():
        async with Engine(MemoryStore(), [Plain]) as engine:
            run = await engine.start(Plain, 1)
            assert await engine.result(run.id, timeout=10) == 2
            import flowkit.otel
            try:
                flowkit.otel.instrument(engine)
            except ImportError as exc:
                print("IMPORT-ERROR:", exc)
            # a worker without --metrics-port: nothing to set up, not an error
            print("WORKER-SETUP:", flowkit.otel.worker_setup(None))
        assert not any(m.startswith("opentelemetry") for m in sys.modules), "imported"
        print("RAN")

    asyncio.run(main())
    """
)


def test_flowkit_runs_without_opentelemetry(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "RAN" in done.stdout
    assert "pip install 'flowkit[otel]'" in done.stdout
    assert "WORKER-SETUP: None" in done.stdout


def test_metric_names_documented() -> None:
    """docs/observability.md lists every metric flowkit.otel makes."""
    text = (ROOT / "docs/observability.md").read_text()
    source = (ROOT / "flowkit/otel.py").read_text()
    names = set(
        re.findall(r'(?:create_\w+|_histogram)\(\s*(?:meter,\s*)?"(flowkit\.[a-z_.]+)"', source)
    )
    assert "flowkit.step.duration" in names
    for name in names:
        assert f"`{name}`" in text, name


async def test_a_collection_reads_the_queue_depth_on_the_engines_loop(
    store: Any, otel: Otel
) -> None:
    """A reader collecting in its own thread (as Prometheus's scrape) starts a read of the
    depths on the engine's loop; a later collection reports it."""
    async with TestEnv(WORKFLOWS, store=store) as env:
        otel.instrument(env.engines[0])
        await env.start("otel-single", {"key": "q"}, "q1")
        await env.start("otel-single", {"key": "q"}, "q2")
        await env.start("otel-single", {"key": "q"}, "q3")
        want = [({"flowkit.workflow": "otel-single"}, 2)]
        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while await asyncio.to_thread(otel.points, "flowkit.singleton.queue_depth") != want:
            assert loop.time() < end, "the depth was never read"
            await asyncio.sleep(0.01)


def test_the_metrics_server_listens_on_this_host_only() -> None:
    """``flowkit worker --metrics-port`` serves its metrics (no authentication) on 127.0.0.1
    unless ``--metrics-host`` (or ``$FLOWKIT_METRICS_HOST``) says otherwise: the address of
    the listening socket."""
    from flowkit.cli import _prepare, build_parser
    from flowkit.cli._common import CliError

    for argv, env, host in (
        ([], {}, "127.0.0.1"),
        (["--metrics-host", "0.0.0.0"], {}, "0.0.0.0"),
        ([], {"FLOWKIT_METRICS_HOST": "0.0.0.0"}, "0.0.0.0"),
    ):
        args = build_parser().parse_args(
            ["worker", "otel_app:WORKFLOWS", "--metrics-port", str(_free_port()), *argv]
        )
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            _prepare(args)
        setup = args.telemetry
        try:
            assert setup.server.socket.getsockname()[0] == host
        finally:
            setup.close()
    # a host without a port: refused on the command line, ignored in the environment
    args = build_parser().parse_args(["worker", "otel_app:WORKFLOWS", "--metrics-host", "::1"])
    with pytest.raises(CliError, match="--metrics-host needs --metrics-port"):
        _prepare(args)
    args = build_parser().parse_args(["worker", "otel_app:WORKFLOWS"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWKIT_METRICS_HOST", "0.0.0.0")
        mp.delenv("FLOWKIT_METRICS_PORT", raising=False)
        _prepare(args)
    assert args.metrics_port is None
    setup = worker_setup(_free_port())
    assert setup is not None
    try:
        assert setup.server.socket.getsockname()[0] == "127.0.0.1"
    finally:
        setup.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_metrics_port_is_checked_before_serving(tmp_path: Path) -> None:
    """A bad ``--metrics-port`` or ``$FLOWKIT_METRICS_PORT`` is one line, exit 2."""
    for args, env in (
        (["--metrics-port", "0"], {}),
        ([], {"FLOWKIT_METRICS_PORT": "port"}),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "flowkit.cli", "worker", "otel_app:WORKFLOWS", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin", **env},
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert "METRICS_PORT" in done.stderr or "--metrics-port" in done.stderr
