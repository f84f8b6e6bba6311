"""The workflows of tests/test_otel*.py, also served by ``flowkit worker otel_app:WORKFLOWS``.

With ``$OTEL_APP_SPANS`` set (a file path), importing this module configures the global
OpenTelemetry tracer provider with ``FileSpanExporter``: every ended span is appended to that
file as one JSON line, so a test can read the spans a worker process made."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from flowkit import RetryPolicy, Singleton, WorkflowCtx, workflow


class Flaky:
    """Fails its first ``fails`` calls per key, then succeeds."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, key: str, fails: int) -> str:
        n = self.calls[key] = self.calls.get(key, 0) + 1
        if n <= fails:
            raise ConnectionError(f"attempt {n} of {key} failed")
        return f"{key} ok"


FLAKY = Flaky()


async def reserve(item: str) -> str:
    return f"reserved {item}"


def charge(item: str) -> str:  # (a sync step: it runs in a step thread)
    return f"charged {item}"


def explode(item: str) -> str:
    raise ValueError(f"no {item}")


@workflow(name="otel-order")
class Order:
    """Two steps, then a flaky one retried (``fails`` failures first)."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        a = await ctx.step(reserve, input["item"])
        b = await ctx.step(charge, input["item"])
        retry = RetryPolicy(max_attempts=5, initial_interval=1.0)
        c = await ctx.step(FLAKY, input["item"], input.get("fails", 0), name="ship", retry=retry)
        return f"{a}, {b}, {c}"


@workflow(name="otel-fail")
class Fail:
    """A step that always raises: the run fails."""

    async def run(self, ctx: WorkflowCtx, item: str) -> str:
        await ctx.step(reserve, item)
        return str(await ctx.step(explode, item))


@workflow(name="otel-waits")
class Waits:
    """A step, a signal wait, a step: the first step is replayed when the run resumes."""

    async def run(self, ctx: WorkflowCtx, item: str) -> str:
        a = await ctx.step(reserve, item)
        await ctx.wait_for_signal("go")
        b = await ctx.step(charge, item)
        return f"{a}, {b}"


@workflow(name="otel-single", singleton=Singleton(key=lambda inp: inp["key"]))
class Single:
    """A singleton run that holds its key until signalled."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        await ctx.wait_for_signal("done")
        return str(await ctx.step(reserve, input["key"]))


WORKFLOWS = [Order, Fail, Waits, Single]


def _configure_file_exporter(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class FileSpanExporter(SpanExporter):
        """Appends each span as a JSON line: name, ids, parent, attributes, status."""

        def __init__(self, path: str) -> None:
            self.path = path
            self.lock = threading.Lock()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            with self.lock, open(self.path, "a", encoding="utf-8") as f:
                for s in spans:
                    ctx = s.get_span_context()
                    assert ctx is not None
                    f.write(
                        json.dumps(
                            {
                                "name": s.name,
                                "trace_id": f"{ctx.trace_id:032x}",
                                "span_id": f"{ctx.span_id:016x}",
                                "parent": f"{s.parent.span_id:016x}" if s.parent else None,
                                "attributes": dict(s.attributes or {}),
                                "status": s.status.status_code.name,
                            }
                        )
                        + "\n"
                    )
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(path)))
    trace.set_tracer_provider(provider)


if os.environ.get("OTEL_APP_SPANS"):
    _configure_file_exporter(os.environ["OTEL_APP_SPANS"])
