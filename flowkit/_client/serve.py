"""``Engine.serve``: run an engine's worker until cancelled or told to stop by SIGTERM/SIGINT,
then drain it (docs/deploying.md). ``flowkit worker`` is this in a process of its own.

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
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from .._core import boot as _boot
from .._core.limits import duration

if TYPE_CHECKING:
    from .core import ClientCore
    from .engine import Engine

log = logging.getLogger("flowkit.worker")

DEFAULT_GRACE = 10.0
"""Seconds a drain lets activations run on towards a durable point (``--grace``)."""
STOP_SIGNALS = _boot.STOP_SIGNALS

__all__ = ["DEFAULT_GRACE", "STOP_SIGNALS", "catch_stop_signals", "release_stop_signals", "serve"]

_EARLY = _boot.EARLY
"""The stop signals a process received before ``serve`` took them over (``catch_stop_signals``)."""


@contextlib.contextmanager
def catch_stop_signals() -> Iterator[None]:
    """SIGTERM/SIGINT are caught from here on (``flowkit worker`` enters this first thing,
    before it imports the app or opens the store): one received before ``serve`` installs its
    own handlers makes ``serve`` stop at once (exit 0, as a drain with nothing to drain)
    instead of the signal killing the process (exit 143); a second one exits at once. The
    previous handlers are back on leaving."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    if not _boot.CAUGHT:  # (``import flowkit`` caught them already in a worker process)
        _EARLY.clear()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _boot.caught_early)
    try:
        yield
    finally:
        _EARLY.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def release_stop_signals() -> None:
    """Not a worker after all (``import flowkit`` guessed from the command line): the
    default handlers again, and a stop signal caught meanwhile takes effect now."""
    if not _boot.CAUGHT:
        return
    _boot.CAUGHT = False
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
    if _EARLY:
        signal.raise_signal(_EARLY.pop(0))


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


async def serve(engine: Engine, core: ClientCore, grace: float | timedelta = DEFAULT_GRACE) -> None:
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
    if _EARLY and installed:  # (a stop signal came while the process was starting)
        early = _EARLY[0]
        _EARLY.clear()
        log.info("%s while starting: stopping before serving", signal.Signals(early).name)
        return
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
            worker, core.worker = core.worker, None
            if worker is not None:
                await worker.drain(secs)
            log.info("worker %s drained: its leases are given back", engine.instance_id)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
