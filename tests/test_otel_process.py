"""OpenTelemetry across real processes (docs/observability.md): a run started in this process
inside a span is executed by a real ``flowkit worker --metrics-port`` process whose app configures a
tracer provider (tests/otel_app.py, spans written to a file): the worker's activation and step
spans continue the trace of the start request, and the worker serves flowkit's metrics for
Prometheus over HTTP. On a SQLite file and PostgreSQL (``sql_backend``)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_app import WORKFLOWS
from store_kit import Backend

from flowkit import Engine
from flowkit.otel import instrument

ROOT = Path(__file__).resolve().parent.parent
BOUND = 60.0


async def until(cond: Callable[[], Any], what: str) -> Any:
    """Poll ``cond`` until it answers something true; fail after ``BOUND`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + BOUND
    while not (found := cond()):
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body: bytes = r.read()
            return body.decode()
    except OSError:
        return None


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_a_worker_process_continues_the_trace_and_serves_metrics(
    sql_backend: Backend, tmp_path: Path
) -> None:
    url = sql_backend.url
    assert url is not None
    spans_file = tmp_path / "spans.jsonl"
    port = _free_port()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    client = Engine(sql_backend.store, WORKFLOWS, worker=False)
    instrument(client, tracer_provider=provider)
    with provider.get_tracer("test").start_as_current_span("checkout") as request:
        await client.start("otel-order", {"item": "lamp", "fails": 1}, "p1")
    trace_id = f"{request.get_span_context().trace_id:032x}"

    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
        "OTEL_APP_SPANS": str(spans_file),
        "FLOWKIT_METRICS_PORT": str(port),  # (the option's default)
    }
    with (tmp_path / "worker.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "flowkit.cli",
            "worker",
            "otel_app:WORKFLOWS",
            "--db",
            url,
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=log,
        )
    try:
        assert await client.result("p1", timeout=BOUND) == "reserved lamp, charged lamp, lamp ok"
        metrics = await until(
            lambda: (m := _scrape(port)) is not None and "flowkit_runs_settled" in m and m,
            "the worker's metrics",
        )
        spans = await until(
            lambda: (s := _spans(spans_file)) and any(x["name"] == "step ship" for x in s) and s,
            "the worker's spans",
        )
        await until(
            lambda: any(
                x["name"] == "run otel-order" and x["attributes"]["flowkit.status"] == "completed"
                for x in _spans(spans_file)
            ),
            "the last activation's span",
        )
        spans = _spans(spans_file)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), BOUND)
    assert code == 0, (tmp_path / "worker.log").read_text()

    # the worker's spans are in the trace of the request made here
    assert {s["trace_id"] for s in spans} == {trace_id}
    (start,) = [s for s in exporter.get_finished_spans() if s.name != "checkout"]
    assert start.name == "start otel-order" and start.context is not None
    runs = [s for s in spans if s["name"] == "run otel-order"]
    assert runs and all(s["parent"] == f"{start.context.span_id:016x}" for s in runs)
    ships = [s for s in spans if s["name"] == "step ship"]
    assert [s["attributes"]["flowkit.attempt"] for s in ships] == [1, 2]
    assert [s["status"] for s in ships] == ["ERROR", "UNSET"]
    assert {s["attributes"]["flowkit.run_id"] for s in spans} == {"p1"}

    # Prometheus text from the worker: flowkit's metrics with their labels
    settled = [
        line
        for line in metrics.splitlines()
        if line.startswith("flowkit_runs_settled") and 'flowkit_status="completed"' in line
    ]
    assert settled and float(settled[0].rsplit(" ", 1)[1]) == 1.0
    assert any(
        line.startswith("flowkit_step_duration") and 'flowkit_step="ship"' in line
        for line in metrics.splitlines()
    )
