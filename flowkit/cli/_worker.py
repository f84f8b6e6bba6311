"""``flowkit worker`` (a worker process that drains on SIGTERM/SIGINT: ``Engine.serve``) and
``flowkit retry`` (``Engine.retry`` from the command line); docs/deploying.md.

Each option of ``worker`` defaults to an environment variable (``FLOWKIT_DB``,
``FLOWKIT_CONCURRENCY``, ``FLOWKIT_NAMESPACE``, ``FLOWKIT_INSTANCE_ID``, ``FLOWKIT_GRACE``,
``FLOWKIT_LEASE_TTL``, ``FLOWKIT_LOG_FORMAT``, ``FLOWKIT_METRICS_PORT``,
``FLOWKIT_METRICS_HOST``), so a unit file or a
container sets them once."""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterable
from typing import Any

from .._client.engine import Engine
from .._client.serve import DEFAULT_GRACE
from .._model.definition import definition_of
from ..logging import JsonFormatter
from ..stores.base import UNSET
from ._common import CliError, import_attr

__all__ = ["add_parsers", "prepare", "retry", "worker"]


UsageError = CliError
"""A bad option or app: ``flowkit.cli`` prints it as one line (exit status 2)."""


def _env_number(name: str, kind: type[int] | type[float], default: Any) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise UsageError(f"${name} must be a number, got {raw!r}") from None


def add_parsers(sub: Any) -> None:
    """The ``worker`` and ``retry`` subcommands of ``flowkit``."""
    w = sub.add_parser(
        "worker",
        help="run a worker for the workflows of MODULE:ATTR until SIGTERM/SIGINT, then drain",
    )
    w.add_argument(
        "app",
        metavar="MODULE:ATTR",
        help="a list of @workflow classes or instances, or a callable returning one",
    )
    # (``--db`` here as well as before the command: ``flowkit worker app:wfs --db URL``)
    w.add_argument("--db", default=argparse.SUPPRESS, help="store URL (default: $FLOWKIT_DB)")
    w.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="the most runs executing here at once (default: $FLOWKIT_CONCURRENCY, else 100)",
    )
    w.add_argument(
        "--namespace",
        default=None,
        help="serve only this namespace's runs and stamp it on the runs started here "
        "(default: $FLOWKIT_NAMESPACE, else every namespace)",
    )
    w.add_argument(
        "--instance-id",
        default=None,
        help="this worker's name, unique among live workers; a restart under the same id "
        "takes its leased runs back at once (default: $FLOWKIT_INSTANCE_ID, else random)",
    )
    w.add_argument(
        "--grace",
        type=float,
        default=None,
        help=f"seconds a drain lets activations reach a durable point (default: $FLOWKIT_GRACE, "
        f"else {DEFAULT_GRACE:g})",
    )
    w.add_argument(
        "--lease-ttl",
        type=float,
        default=None,
        help="seconds a lease lasts without renewal (default: $FLOWKIT_LEASE_TTL, else 30)",
    )
    w.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="log lines on stderr as text or one JSON object each (default: "
        "$FLOWKIT_LOG_FORMAT, else text)",
    )
    w.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (needs flowkit[otel]; default: "
        "$FLOWKIT_METRICS_PORT, else none)",
    )
    w.add_argument(
        "--metrics-host",
        default=None,
        help="the address the metrics are served on; they need no authentication, so keep "
        "it private (default: $FLOWKIT_METRICS_HOST, else 127.0.0.1: this host only)",
    )
    r = sub.add_parser("retry", help="re-open a failed or dead run (Engine.retry)")
    r.add_argument("run")
    r.add_argument(
        "--input",
        metavar="JSON",
        default=None,
        help="a new input, validated against the input schema the run's workers recorded",
    )
    r.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        default=None,
        help="the workflows (as for worker): their code validates --input instead",
    )


def load_app(spec: str) -> list[Any]:
    """The workflows ``MODULE:ATTR`` names: a list (or other iterable) of @workflow classes or
    instances, one of them, or a callable returning either."""
    obj = import_attr(spec, "expected MODULE:ATTR")
    if callable(obj) and definition_of(obj) is None:
        try:
            obj = obj()
        except Exception as exc:
            raise UsageError(f"{spec}() raised {type(exc).__name__}: {exc}") from None
    items: Iterable[Any] = [obj] if definition_of(obj) is not None else obj
    try:
        found = list(items)
    except TypeError:
        raise UsageError(f"{spec} is not a list of workflows: {type(obj).__name__}") from None
    for wf in found:
        if definition_of(wf) is None:
            raise UsageError(f"{spec} holds {wf!r}, which is not a @workflow class or instance")
    if not found:
        raise UsageError(f"{spec} holds no workflow")
    return found


def prepare(args: argparse.Namespace) -> None:
    """Checks and imports done before the event loop starts (``flowkit.cli._prepare``)."""
    if args.cmd == "retry":
        args.workflows = load_app(args.app) if args.app else []
        args.input_value = UNSET
        if args.input is not None:
            try:
                args.input_value = json.loads(args.input)
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"--input is not valid JSON: {exc.msg} at column {exc.colno}"
                ) from None
        return
    if args.concurrency is None:
        args.concurrency = _env_number("FLOWKIT_CONCURRENCY", int, 100)
    if args.concurrency < 1:
        raise UsageError(f"--concurrency takes a count >= 1, got {args.concurrency}")
    if args.grace is None:
        args.grace = _env_number("FLOWKIT_GRACE", float, DEFAULT_GRACE)
    if not args.grace >= 0:
        raise UsageError(f"--grace takes seconds >= 0, got {args.grace}")
    if args.lease_ttl is None:
        args.lease_ttl = _env_number("FLOWKIT_LEASE_TTL", float, 30.0)
    if not args.lease_ttl > 0:
        raise UsageError(f"--lease-ttl takes seconds > 0, got {args.lease_ttl}")
    args.namespace = args.namespace or os.environ.get("FLOWKIT_NAMESPACE") or None
    args.instance_id = args.instance_id or os.environ.get("FLOWKIT_INSTANCE_ID") or None
    args.log_format = args.log_format or os.environ.get("FLOWKIT_LOG_FORMAT") or "text"
    if args.log_format not in ("text", "json"):
        raise UsageError(f"$FLOWKIT_LOG_FORMAT must be text or json, got {args.log_format!r}")
    if args.metrics_port is None:
        args.metrics_port = _env_number("FLOWKIT_METRICS_PORT", int, None)
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise UsageError(f"--metrics-port takes a port 1-65535, got {args.metrics_port}")
    if args.metrics_host is not None and args.metrics_port is None:
        raise UsageError("--metrics-host needs --metrics-port")
    # (the variable alone, without a port, says nothing: an image may set both, a run unset one)
    args.metrics_host = args.metrics_host or os.environ.get("FLOWKIT_METRICS_HOST") or None
    args.workflows = load_app(args.app)
    args.telemetry = _telemetry_setup(args.metrics_port, args.metrics_host)


def _telemetry_setup(port: int | None, host: str | None = None) -> Any:
    """``flowkit.otel.serving``'s setup for the worker, or ``None``: with ``--metrics-port``
    (else a usage error without the extra), or when the app configured an OpenTelemetry SDK
    (its tracer provider: spans, no metrics). ``host``: where the metrics are served
    (``None``: 127.0.0.1)."""
    if port is None and importlib.util.find_spec("opentelemetry") is None:
        return None
    try:
        from .. import otel
    except ImportError as exc:  # pragma: no cover - a broken install
        raise UsageError(f"--metrics-port: {exc}") from None
    try:
        if host is None:
            return otel.worker_setup(port)
        return otel.worker_setup(port, host)
    except ImportError as exc:
        raise UsageError(f"--metrics-port needs OpenTelemetry: {exc}") from None
    except OSError as exc:  # (the port is taken, the host is not an address of this machine)
        raise UsageError(f"cannot serve metrics on {host or '127.0.0.1'}:{port}: {exc}") from None


def _configure_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)


async def worker(args: argparse.Namespace, out: Any, store: Any) -> int:
    """Serve until SIGTERM/SIGINT, drain, exit 0 (``Engine.serve``)."""
    from ..stores.sql import SqlStore

    _configure_logging(args.log_format)
    # (creates flowkit's tables in a new database; scoped: only the namespace's runs)
    store = SqlStore(args.db, namespace=args.namespace)
    if args.codec is not None:
        from ..stores.codec import CodecStore

        store = CodecStore(store, args.codec)
    try:
        engine = Engine(
            store,
            args.workflows,
            instance_id=args.instance_id,
            namespace=args.namespace,
            max_concurrency=args.concurrency,
            lease_ttl=args.lease_ttl,
        )
        if (setup := getattr(args, "telemetry", None)) is not None:
            setup(engine)  # (flowkit.otel: spans, and metrics on --metrics-port)
        await engine.serve(args.grace)
    finally:
        store.close()
    return 0


async def retry(args: argparse.Namespace, out: Any, store: Any) -> int:
    """Re-open a failed or dead run; errors are ``FlowkitError`` lines from ``flowkit.cli``."""
    engine = Engine(store, args.workflows, worker=False)
    run = await engine.retry(args.run, input=args.input_value)
    new = " with a new input" if args.input_value is not UNSET else ""
    out.line(
        ("retried", "green"),
        f" {run.id}{new}: {run.status} (attempt {run.attempt}); a worker running "
        f"{run.workflow} v{run.workflow_version} picks it up",
    )
    return 0
