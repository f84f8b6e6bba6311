"""What an activation runner hands its activations: the activation's window on the store
(``StoreWindow``: appends fenced by the worker's lease, timers, step threads) and the threads sync
steps run in (``StepRunner``). Kept apart from ``_worker/runner.py`` so that the drive stays one
story: claim → gate → replay → settle; the record of one try is ``_worker/port.py``'s ``Try``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import TYPE_CHECKING, Any

from .._core.run import Run, RunStatus
from .._core.telemetry import ActivationObserver, onward_tags
from .._replay.children import ChildCall, ChildStart
from ..errors import LeaseLostError, UnsupportedStoreError
from ..events import CancelRequested, Event, EventSet, UpdateReplied
from ..stores.base import InboxSignal, TakenEvent, Update, publishes_events
from . import children as _children
from .config import WorkerConfig
from .recovery import LeaseProof
from .step_threads import StepThreads, waited_for

if TYPE_CHECKING:
    from pydantic import TypeAdapter

    from .port import RunnerPort


_AWAITED = (EventSet, UpdateReplied)
"""The events an ``engine.get_event`` / ``engine.update`` caller may be waiting for."""


class StoreWindow:
    """The activation's window on the store: appends fenced by this worker's lease."""

    __slots__ = ("_d", "_events", "_proof", "_run", "_run_id", "telemetry")

    def __init__(
        self,
        drive: RunnerPort,
        run: Run,
        proof: LeaseProof,
        telemetry: ActivationObserver | None,
        events: Sequence[Event] = (),
    ) -> None:
        self._d = drive
        self._run = run
        self._run_id = run.id
        self._proof = proof
        # who observes this activation's step attempts (``_core/telemetry.py``), or None
        self.telemetry = telemetry
        self._events = events  # (the run's history: its trace context, for its children)

    def now(self) -> float:
        return self._d.clock.now()

    @property
    def max_payload_bytes(self) -> int:
        return self._d.config.max_payload_bytes

    def lease_live(self) -> bool:
        return self._proof.live()

    async def sleep_until(self, deadline: float) -> None:
        await self._d.clock.sleep_until(deadline)

    def add_timer(self, token: object, at: float) -> None:
        self._d.timers[token] = at

    def drop_timer(self, token: object) -> None:
        self._d.timers.pop(token, None)

    def step_began(self) -> object:
        token = object()
        self._d.in_flight.add(token)
        return token

    def step_ended(self, token: object) -> None:
        d = self._d
        d.in_flight.discard(token)
        ended, d.step_ended = d.step_ended, None
        if ended is not None and not ended.done():
            ended.set_result(None)

    def in_thread(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        return self._d.steps.submit(fn, args, kwargs)

    async def record(
        self,
        events: Sequence[Event],
        consume_signal: int | None = None,
        search: dict[str, Any] | None = None,
    ) -> bool:
        """Append ``events`` under the lease (taking the inbox signal ``consume_signal`` with
        them; ``search``: the run's new search attributes, ``Update.search``); whether the
        run is ``cancelling`` now."""
        d = self._d
        if not self._proof.live():
            raise LeaseLostError(self._run_id)  # (the activation stops, writing nothing)
        # a step's record: events only (AppendsEvents); None: not that simple, commit
        if (
            d.appends is not None
            and events
            and consume_signal is None
            and search is None
            # (a value or reply someone waits for takes the commit path: its wake-up)
            and not any(isinstance(e, _AWAITED) for e in events)
            and await d.appends.append_events(self._run_id, d.owner, d.clock.now(), events)
        ):
            self._told(events)
            return False  # (the run was ``running``, so not cancelling)
        res = await d.store.commit(
            self._run_id,
            d.owner,
            d.clock.now(),
            Update(events=events, consume_signal=consume_signal, search=search),
        )
        self._told(events)
        return res.run.status is RunStatus.CANCELLING

    def _told(self, events: Sequence[Event]) -> None:
        """Readers of this run's history hear of an event they may wait for."""
        recorded = self._d.config.recorded
        if recorded is not None and any(isinstance(e, _AWAITED) for e in events):
            recorded(self._run_id)

    async def peek_signal(self, name: str) -> InboxSignal | None:
        return await self._d.store.peek_signal(self._run_id, name)

    async def take_event(
        self, pos: str, name: str, match: dict[str, str], *, wait: bool
    ) -> TakenEvent | None:
        store: Any = self._d.store
        if not publishes_events(store):
            raise UnsupportedStoreError(f"{store!r} has no published events (publishes_events)")
        taken: TakenEvent | None = await store.take_event(
            self._run_id, pos, name, match, self._d.clock.now(), wait=wait
        )
        return taken

    async def drop_event_wait(self, pos: str, name: str) -> None:
        store: Any = self._d.store
        if not publishes_events(store):
            raise UnsupportedStoreError(f"{store!r} has no published events (publishes_events)")
        again = await store.drop_event_wait(self._run_id, pos, name, self._d.clock.now())
        for rid in again:  # (an event given back reached other waiters: they run now)
            self._d.hooks.dispatch(rid)

    async def compensating(self, events: Sequence[Event]) -> None:
        d = self._d
        if not self._proof.live():
            raise LeaseLostError(self._run_id)
        update = Update(events=events, status=RunStatus.CANCELLING)
        await d.store.commit(self._run_id, d.owner, d.clock.now(), update)

    async def cancel_compensates(self) -> bool:
        events = await self._d.store.load_events(self._run_id)
        asked = [e for e in events if isinstance(e, CancelRequested)]
        return bool(asked) and asked[-1].compensate

    async def start_child(self, parent_id: str, call: ChildCall) -> ChildStart:
        trace = onward_tags(self.telemetry, self._events)  # (the child joins this trace)
        return await _children.start_child(self._d, self._run, call, trace)

    def child_output_adapter(self, workflow: str, version: str | None) -> TypeAdapter[Any] | None:
        """The output type of a child workflow named by name, as registered here."""
        entry = self._d.config.registry.get(workflow, version)
        return None if entry is None else entry[0].output_adapter

    async def child_run(self, run_id: str) -> Run | None:
        return await _children.child_run(self._d.store, run_id)


class StepRunner:
    """The threads a worker's sync steps run in, started with the first one
    (``_worker/step_threads.py``)."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        self._pool: StepThreads | None = None

    @property
    def pool(self) -> StepThreads | None:
        """The pool, once a sync step started it."""
        return self._pool

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Call ``fn`` in a step thread: the future of its outcome, on the event loop (which
        a cancellation abandons: the thread runs on, what it returns is ignored). With
        ``wait_for_step_threads`` (``TestEnv``) the loop waits for the thread instead."""
        pool = self._pool
        if pool is None:
            pool = self._pool = StepThreads(self._config.step_threads)
        call = pool.submit(fn, *args, **kwargs)
        if not self._config.wait_for_step_threads:
            fut = asyncio.wrap_future(call)
            waited_for(fut)
            return fut
        futures.wait((call,))  # (blocks the loop, as a sync step on it did)
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        exc = call.exception()
        if exc is None:
            done.set_result(call.result())
        else:
            done.set_exception(exc)
        del exc, call
        return done

    def close(self) -> None:
        """The worker stopped: the step threads end, without waiting for those still busy
        with an abandoned step (daemon threads: they end when its function returns)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def clean(text: str, limit: int = 2000) -> str:
    """An error message every store can hold: no NUL, bounded length."""
    text = text.replace("\x00", "\\x00")
    return text if len(text) <= limit else text[: limit - 3] + "..."
