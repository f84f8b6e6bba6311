"""``StepThreads``: the threads synchronous step functions run in (``Engine(step_threads=N)``),
so that a blocking call in one run never stalls the event loop, and with it the other runs.

Its threads start as they are needed, up to ``size``, and are daemons: a thread that a
timed-out (or cancelled) step abandoned keeps running until its function returns, since a
thread cannot be killed, but it never keeps the process from exiting, and ``shutdown`` does
not wait for it. (``concurrent.futures.ThreadPoolExecutor`` joins its threads at exit.)"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_STEP_THREADS = 32
"""Threads for synchronous steps per engine when ``Engine(step_threads=...)`` is not given:
started only as sync steps need them (an engine whose steps are all async starts none)."""

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


# the step calls running in threads that a step waits for, on whichever event loop
_WAITED: set[asyncio.Future[Any]] = set()


def waited_for(fut: asyncio.Future[Any]) -> None:
    """A step waits for ``fut`` (a call in a step thread) until it is done or abandoned."""
    _WAITED.add(fut)
    fut.add_done_callback(_WAITED.discard)


def steps_in_threads() -> list[asyncio.Future[Any]]:
    """The sync steps of the running event loop's engines that run in their threads now and
    that a step still waits for (abandoned ones left out): ``TestEnv.settle`` counts them as
    running, not blocked."""
    loop = asyncio.get_running_loop()
    return [f for f in _WAITED if f.get_loop() is loop]


def check_size(step_threads: object) -> int:
    """``step_threads`` as given to ``Engine``: a whole number >= 1, else ``ValueError``."""
    if isinstance(step_threads, bool) or not isinstance(step_threads, int) or step_threads < 1:
        raise ValueError(f"step_threads must be an int >= 1, got {step_threads!r}")
    return step_threads


class StepThreads(Executor):
    """A pool of at most ``size`` daemon threads; ``submit`` runs the call in the caller's
    context (``contextvars``), as ``asyncio.to_thread`` does."""

    def __init__(self, size: int, name: str = "flowkit-step") -> None:
        self.size = check_size(size)
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # released by a thread that waits for work
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        fut: Future[T] = Future()
        ctx = contextvars.copy_context()
        with self._lock:
            if self._closed:
                raise RuntimeError("the step threads were shut down (the engine stopped)")
            self._queue.put((fut, ctx.run, (fn, *args), kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self.size:
                t = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(t)
                t.start()
        return fut

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Stop taking work; calls not started are cancelled (``cancel_futures``), each idle
        thread ends, and a busy one ends when its call returns. ``wait`` waits for that."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                if t is not threading.current_thread():
                    t.join()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            del item
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    fut.set_exception(exc)
                    del exc
                else:
                    fut.set_result(result)
                    del result
            del fut, fn, args, kwargs
            self._idle.release()
