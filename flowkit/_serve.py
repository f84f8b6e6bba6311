"""``Engine.serve``: run an engine's worker until cancelled or told to stop by SIGTERM/SIGINT,
then drain it (DESIGN §12). ``flowkit worker`` is this in a process of its own.

The drain (``Worker.drain``) claims nothing more, lets each activation reach a durable point
within ``grace`` seconds and gives every lease back, so another worker takes the runs at once
instead of after the lease TTL. A second signal during the drain ends the process at once
(``os._exit(128 + signal number)``: 143 for SIGTERM, 130 for SIGINT): its leases then expire."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from ._limits import duration

if TYPE_CHECKING:
    from ._engine import Engine

log = logging.getLogger("flowkit.worker")

DEFAULT_GRACE = 10.0
"""Seconds a drain lets activations run on towards a durable point (``--grace``)."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

__all__ = ["DEFAULT_GRACE", "STOP_SIGNALS", "serve"]


def _exit_now(signum: int) -> None:
    """The second signal: leave at once, without waiting for anything (not even a step
    running in a thread); the leases held here expire after their TTL."""
    log.warning(
        "second %s: exiting at once; the leases held here expire after their TTL",
        signal.Signals(signum).name,
    )
    for handler in logging.getLogger().handlers + log.handlers:
        with contextlib.suppress(Exception):  # (best effort before leaving)
            handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


async def serve(engine: Engine, grace: float | timedelta = DEFAULT_GRACE) -> None:
    """``Engine.serve`` (its docstring says what it does)."""
    if not engine.is_worker:
        raise RuntimeError("engine.serve() needs an engine with a worker (worker=True)")
    secs = duration("grace", grace)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) > 1:
            _exit_now(signum)
        log.info(
            "%s: draining (grace %.3g s): claiming nothing more, giving leases back",
            signal.Signals(signum).name,
            secs,
        )
        stop.set()

    installed: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, on_signal, int(sig))
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            pass
    try:
        await engine.start_worker()
        log.info(
            "worker %s serving %s (concurrency %d%s)",
            engine.instance_id,
            ", ".join(f"{n} v{v}" for n, v in sorted(engine.registry.pairs())) or "no workflow",
            engine.max_concurrency,
            f", namespace {engine.namespace}" if engine.namespace else "",
        )
        try:
            await stop.wait()
        finally:  # (a signal, or the caller cancelled serve: drain either way)
            worker, engine._worker = engine._worker, None
            if worker is not None:
                await worker.drain(secs)
            log.info("worker %s drained: its leases are given back", engine.instance_id)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
