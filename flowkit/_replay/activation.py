"""Deterministic execution of a workflow body over its history (one *activation*).

The body re-executes from the top; each ctx call takes the next position of its branch (the
body is branch ``""``; ``ctx.gather`` children get ``"<pos>.<i>/"``), so positions never depend
on timing. A call whose position has recorded events returns/raises the recorded outcome; a new
call runs and records. When every live branch waits on a durable wait that this activation
cannot satisfy (a timer not yet due, a signal not yet sent, a retry backoff) the activation is
*stuck*: it tears the body down and reports ``Suspended`` with the earliest wake time.

Each branch runs under a ``_Guard`` that sees what it yields to the event loop: an await that
is not a ctx call, a cancellation flowkit did not request and a ctx call never awaited all end
the activation with ``Diverged`` (the run is blocked) rather than record a history a replay
would not reproduce. A requested cancellation is delivered to each branch once, at its first
await the history does not answer (see ``request_cancel``).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from . import _serde
from ._activation_parts import (
    _BRANCH,
    _FOREIGN_AWAIT,
    _FOREIGN_CANCEL,
    _FOREIGN_TASK,
    _UNAWAITED,
    Cancelled,
    Completed,
    Diverged,
    Evicted,
    Failed,
    Host,
    Outcome,
    ReplayStub,
    Suspended,
    _awaited,
    _Branch,
    _call_frame,
    _call_of,
    _ControlFlow,
    _describe,
    _describe_call,
    _Diverged,
    _Evicted,
    _Guard,
    _Park,
    _seed,
    _silence,
    error_info,
)
from ._calls import StepCalls
from ._context import WorkflowCtx
from ._definition import WorkflowDefinition
from ._eager import start_next
from ._history import (
    CancelRequested,
    ErrorInfo,
    Event,
    RunRetried,
    RunStarted,
    StepFailed,
    TimerFired,
    TimerStarted,
)
from .errors import (
    LeaseLostError,
    NonDeterminismError,
    SerializationError,
)
from .stores.base import ConflictError

__all__ = [
    "Activation",
    "Cancelled",
    "Completed",
    "Diverged",
    "Evicted",
    "Failed",
    "Host",
    "Outcome",
    "ReplayStub",
    "Suspended",
    "error_info",
]


class Activation(StepCalls):
    """One execution of a body against a run's history; ``run()`` returns an ``Outcome``."""

    def __init__(
        self,
        defn: WorkflowDefinition,
        instance: Any,
        run_id: str,
        input_value: Any,
        events: Sequence[Event],
        host: Host,
        *,
        cancel_requested: bool = False,
        attempt: int = 1,
        replay_only: bool = False,
        unwritten: Sequence[Event] = (),
    ) -> None:
        self.replay_only = replay_only
        self.replay_stopped_at: str | None = None
        self.defn = defn
        self.instance = instance
        self.run_id = run_id
        self.workflow = defn.name
        self.attempt = attempt
        self.input_value = input_value
        self.host = host
        self._index: dict[str, list[Event]] = {}
        self._events = list(events)
        self._consumed: set[str] = set()
        self._start_at = 0.0
        # the history says the cancellation was requested (since the last retry): also when
        # the run is no longer ``cancelling`` (it got blocked meanwhile), deliveries it
        # recorded replay as they happened
        cancel_in_history = False
        for ev in events:
            if isinstance(ev, RunStarted):
                self._start_at = ev.at
            elif isinstance(ev, RunRetried):
                self._forget_final_failures()
                cancel_in_history = False
            elif isinstance(ev, CancelRequested):
                cancel_in_history = True
            pos = getattr(ev, "pos", None)
            if pos is not None:
                self._index.setdefault(pos, []).append(ev)
        self._live = 0
        self._blocked = 0
        self._parks: list[_Park] = []
        # what runs a step right now: the task of the branch awaiting it (a coroutine step
        # runs inline), or the future of an awaitable step
        self._step_tasks: set[asyncio.Future[Any]] = set()
        # the tasks of the ctx.gather children that have not ended
        self._children: set[asyncio.Task[Any]] = set()
        # tasks request_cancel cancelled inside a step: the step's end takes that request
        # back (Task.uncancel), as the body only sees the step's CancelledError
        self._cancelled_hosts: set[asyncio.Future[Any]] = set()
        self._is_done = False  # the body settled or got stuck (see _mark_done)
        self._done_fut: asyncio.Future[None] | None = None
        self._cancel_requested = cancel_requested or cancel_in_history
        self._tearing_down = False
        self._evicted = False
        self._divergence: NonDeterminismError | None = None
        self._stuck_parks: list[_Park] = []
        self._body_task: asyncio.Task[Any] | None = None
        self.store_error: Exception | None = None
        # Events not yet written: deferred outcomes (see _defer) and, first, ``unwritten``
        # bookkeeping the caller hands over (e.g. ``singleton_admitted``, whose fact is
        # already durable on the run row): those ride with the next write but never force one.
        self.pending: list[Event] = list(unwritten)
        self._must_flush = False

    def _forget_final_failures(self) -> None:
        """After ``run_retried`` a step's failures no longer count: it runs again."""
        for pos, evs in list(self._index.items()):
            if evs and isinstance(evs[-1], StepFailed) and evs[-1].retry_at is None:
                kept: list[Event] = [e for e in evs if not isinstance(e, StepFailed)]
                if kept:
                    self._index[pos] = kept
                else:
                    del self._index[pos]

    # -- facts -------------------------------------------------------------------------
    @property
    def is_replaying(self) -> bool:
        return len(self._consumed) < len(self._index)

    def _branch(self) -> _Branch:
        cur = _BRANCH.get()
        if cur is None or cur[0] is not self:
            raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
        return cur[1]

    def now(self) -> float:
        return self._branch().now_at

    def random(self) -> float:
        return self._branch().rng.random()

    def randbits(self, k: int) -> int:
        return self._branch().rng.getrandbits(k)

    # -- control -----------------------------------------------------------------------
    def request_cancel(self) -> None:
        """The run's cancellation was requested. It is *delivered* to each branch of the
        body once, as a ``CancelledError`` at its first await the history does not answer:
        at once to the waits parked now and the steps running now, else at the branch's next
        new step (recorded there as a cancelled ``step_failed`` before it starts) or durable
        wait. After its delivery a branch's new steps run (cleanup); durable waits always
        raise ``CancelledError`` once the cancellation was requested."""
        if self._cancel_requested:
            return
        self._cancel_requested = True
        for park in list(self._parks):
            if not park.fut.done():
                park.fut.set_exception(asyncio.CancelledError())
        for t in list(self._step_tasks):
            if t.cancel():
                self._cancelled_hosts.add(t)

    def evict(self) -> None:
        """Stop at once without recording anything more (lease lost, engine stopping): the
        body and its running steps are cancelled, as a dying process would lose them."""
        self._evicted = True
        self._tearing_down = True
        self._mark_done()
        for t in list(self._step_tasks):
            t.cancel()
        if self._body_task is not None and not self.replay_only:
            self._body_task.cancel()

    def _stop_replay(self, pos: str, call: str) -> _Evicted:
        """Replay-only mode reached the end of the history: stop without side effects."""
        if self.replay_stopped_at is None:
            self.replay_stopped_at = f"{call} at position {pos}"
        self.evict()
        return _Evicted()

    def _mark_done(self) -> None:
        self._is_done = True
        fut = self._done_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _check_alive(self) -> None:
        if self._tearing_down:
            raise _Evicted()

    def _check_stuck(self) -> None:
        if self._live > 0 and self._blocked >= self._live and self._parks:
            self._mark_done()

    def _diverge(
        self, pos: str, recorded: str | None, call: str | None, detail: str = ""
    ) -> _Diverged:
        if self._divergence is None:
            self._divergence = NonDeterminismError(pos, recorded, call, detail, self._window(pos))
        self._mark_done()
        return _Diverged(self._divergence)

    def _window(self, pos: str, width: int = 2) -> tuple[str, ...]:
        """The recorded events around position ``pos`` (by ``seq``), for the report."""
        evs = self._index.get(pos)
        if evs:
            center = evs[0].seq
        else:  # nothing recorded there: show the end of the history
            center = self._events[-1].seq if self._events else 0
        return tuple(
            _describe(e) for e in self._events if center - width <= e.seq <= center + width
        )

    def _recorded(self, pos: str) -> str | None:
        evs = self._index.get(pos)
        return _describe(evs[0]) if evs else None

    def _enter(self, made_in: _Branch, idx: int) -> _Branch:
        """A ctx call (number ``idx`` of branch ``made_in``) starts executing: the branch
        executing it, whose count of executing calls it raises (see ``_Guard``). It must start
        after the calls made before it, in its branch's own task, or else in a child branch of
        the ``ctx.gather`` it was given to. ``_step`` inlines this."""
        br = made_in
        if br.running:
            if idx != br.next:
                raise self._unawaited(br)
            br.next = idx + 1
        else:
            br = self._running_branch(made_in)
        br.depth += 1
        return br

    def _running_branch(self, made_in: _Branch) -> _Branch:
        """The branch executing a ctx call made on ``made_in`` while that one is not running:
        a child of the ``ctx.gather`` it was given to; else the call runs in a task of its
        own, which fails the activation."""
        cur = _BRANCH.get()
        if cur is None or cur[0] is not self:
            raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
        br: _Branch = cur[1]
        if br is made_in or not br.running:
            raise self._in_foreign_task()
        return br

    def _in_foreign_task(self) -> _Diverged:
        """The ctx call being entered runs in a task of its own."""
        pos, call = _describe_call(_call_frame())
        return self._diverge(
            pos, self._recorded(pos), f"{call} awaited in a task of its own", _FOREIGN_TASK
        )

    def _cancel_left(self, br: _Branch) -> None:
        """A ``CancelledError`` leaves a ctx call of branch ``br``: the delivery of the run's
        cancellation, or (the task is being cancelled by someone else: ``asyncio.timeout``,
        ``task.cancel()``) a cancellation flowkit did not request, which fails the
        activation: it is recorded nowhere, so a replay would not reproduce it."""
        if self._tearing_down:
            return
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            pos, call = _describe_call(_call_frame())
            raise self._diverge(
                pos,
                self._recorded(pos),
                f"{call}, cancelled by code outside flowkit",
                _FOREIGN_CANCEL,
            )
        br.delivered = True

    def _foreign_await(self, br: _Branch, it: object, yielded: object) -> BaseException:
        """Branch ``br`` yielded to the event loop outside its ctx calls (``_Guard``): the
        exception thrown into it there."""
        if self._tearing_down:
            return _Evicted()
        pos = f"{br.prefix}{br.counter + 1}"
        return self._diverge(
            pos,
            self._recorded(pos),
            f"await of {_awaited(it, yielded)}, not a ctx call",
            _FOREIGN_AWAIT,
        )

    def _unawaited(self, br: _Branch) -> _Diverged:
        """The oldest ctx call made on ``br`` and not awaited in its turn (``br.next``)."""
        pos = f"{br.prefix}{br.next}"
        coro: Any = br.head
        call = "a ctx call"
        if coro is not None and coro.cr_frame is not None:
            at, desc = _call_of(coro.cr_code.co_name, coro.cr_frame.f_locals)
            if at == pos:
                call = desc
        return self._diverge(
            pos, self._recorded(pos), f"{call}, never awaited (or awaited too late)", _UNAWAITED
        )

    def _branch_done(self, br: _Branch) -> None:
        """Branch ``br``'s coroutine has ended: a ctx call it made and never awaited fails the
        activation (unless it is being torn down); that call is closed unrun."""
        if br.next <= br.counter:
            if not self._tearing_down and self._divergence is None:
                self._unawaited(br)
            head: Any = br.head
            if head is not None and inspect.getcoroutinestate(head) == inspect.CORO_CREATED:
                head.close()  # (Python's "never awaited" warning would only repeat ours)
        br.head = None

    def _take(
        self,
        pos: str,
        kinds: tuple[type[Event], ...],
        call: str,
        name: str,
        args: Callable[[], str] | None = None,
    ) -> list[Event]:
        """Recorded events at ``pos``; raise divergence if they answer a different call."""
        evs = self._index.get(pos, [])
        for ev in evs:
            ev_name = getattr(ev, "name", name)
            if name == ReplayStub.ANY_NAME:
                ev_name = name
            wrong = not isinstance(ev, kinds) or (
                ev_name != name and not isinstance(ev, TimerFired)
            )
            if isinstance(ev, TimerStarted) and ev.purpose != (
                "sleep" if call == "sleep" else "signal_timeout"
            ):
                wrong = True
            if wrong:
                desc = f"{call}({name!r}" + (f", args {args()}" if args else "") + ")"
                raise self._diverge(pos, _describe(ev), desc)
        if evs:
            self._consumed.add(pos)
        return evs

    def _observe(self, ev: Event) -> None:
        br = self._branch()
        if ev.at > br.now_at:
            br.now_at = ev.at

    async def _record(self, events: Sequence[Event], consume_signal: int | None = None) -> None:
        self._check_alive()
        if self.replay_only:
            ev = events[0]
            raise self._stop_replay(getattr(ev, "pos", "?"), ev.type)
        # Take the deferred events now: a concurrent branch recording meanwhile must neither
        # write them twice nor lose one it defers while this write is in flight.
        batch, self.pending = self.pending, []
        must_flush, self._must_flush = self._must_flush, False
        try:
            cancel = await self.host.record([*batch, *events], consume_signal)
        except LeaseLostError:
            self.evict()
            raise _Evicted() from None
        except ConflictError:
            if consume_signal is not None:
                self.pending[:0] = batch  # nothing was written: keep them for the next write
                self._must_flush = self._must_flush or must_flush
                raise  # the signal went to a racing activation: the caller looks again
            self.evict()
            raise _Evicted() from None
        except Exception as exc:
            # The store failed: nothing more may run on a history we could not extend. The
            # activation stops; the lease expires and recovery replays the run.
            self.store_error = exc
            self.evict()
            raise _Evicted() from exc
        except asyncio.CancelledError:
            if not self._tearing_down:
                # Cancelled by code outside flowkit (``_cancel_left`` blocks the run): a store
                # call cancelled while it waits has not written, so the deferred events go
                # with the blocked run's commit. (Were it cancelled after its commit, they
                # would be there twice, and replay reads the first.)
                self.pending[:0] = batch
                self._must_flush = self._must_flush or must_flush
            raise
        for ev in events:  # only the caller's: deferred events were observed by their branch
            self._observe(ev)
        if cancel:
            self.request_cancel()

    def _defer(self, event: Event) -> None:
        """Record ``event`` with the next write instead of a write of its own: it is flushed
        before any further side effect (the next step function) and otherwise travels in the
        activation's final commit. A crash before the flush re-runs just that step."""
        self.pending.append(event)
        self._must_flush = True
        self._observe(event)

    async def _flush(self) -> None:
        if self._must_flush:
            await self._record([])

    async def _park(self, deadline: float | None, signal: str | None = None) -> None:
        """Wait durably. Never returns within this activation: it raises ``CancelledError``
        on cancellation, or ``_Evicted`` when the activation suspends."""
        self._check_alive()
        if self._cancel_requested:
            raise asyncio.CancelledError()
        park = _Park(deadline, signal, asyncio.get_running_loop().create_future())
        self._parks.append(park)
        self._blocked += 1
        try:
            self._check_stuck()
            await park.fut
        finally:
            self._blocked -= 1
            self._parks.remove(park)
            # (the exception leaving here keeps this frame: not the park, whose future holds
            # that exception, a cycle)
            del park

    # -- the activation ----------------------------------------------------------------
    async def _body(self) -> Any:
        root = _Branch(prefix="", now_at=self._start_at, seed=_seed(self.run_id))
        _BRANCH.set((self, root))
        try:
            body = self.instance.run(WorkflowCtx(self), self.input_value)
            return await _Guard(body, root, self._foreign_await)
        finally:
            self._live -= 1
            self._branch_done(root)
            self._mark_done()

    async def run(self) -> Outcome:
        """Execute the body until it settles or gets stuck; never raises for body errors."""
        self._live = 1
        loop = asyncio.get_running_loop()
        done = self._done_fut = loop.create_future()
        # (started next: the body continues the activation, e.g. of a run just handed over,
        # ahead of the other runs' ready work)
        body = self._body_task = start_next(self._body())
        body.add_done_callback(self._body_ended)
        try:
            if not self._is_done:
                await done
        except asyncio.CancelledError:
            self.evict()  # our worker is going away: so does the body
            raise
        self._stuck_parks = list(self._parks)
        if not body.done() or self._live > 0:  # (a gather's children may outlive the body)
            await self._teardown(body)
        try:
            return self._outcome(body)
        finally:
            # the body's task holds this activation (in its context), and a park's future the
            # exception whose traceback holds the body's frames: let go of both, so that
            # refcounting frees all of it when the run is done, not the cyclic GC, whose
            # pauses hold up every run of the process
            self._body_task = None
            self._stuck_parks = []

    def _body_ended(self, body: asyncio.Task[Any]) -> None:
        self._mark_done()
        # (read now: ``_outcome`` reads it again; an activation that never gets there, evicted
        # or cancelled with its process, leaves an outcome that is nobody's, not to be logged
        # as "never retrieved")
        _silence(body)

    async def _teardown(self, body: asyncio.Task[Any]) -> None:
        self._tearing_down = True
        for park in list(self._parks):
            if not park.fut.done():
                park.fut.set_exception(_Evicted())
        for t in list(self._step_tasks):
            t.cancel()
        if not body.done() or self._children:
            # Give the body (and the children of a gather it left) its chance to unwind
            # through their parked awaits.
            for _ in range(100):
                await asyncio.sleep(0)
                if body.done() and not self._children:
                    break
            else:
                rest = {body, *self._children}
                for t in rest:
                    t.cancel()
                await asyncio.wait(rest)

    def _outcome(self, body: asyncio.Task[Any]) -> Outcome:
        if self._evicted:
            _silence(body)
            return Evicted()
        if self._divergence is not None:
            _silence(body)
            return Diverged(self._divergence)
        if self._tearing_down:
            _silence(body)
            wakes = [p.deadline for p in self._stuck_parks if p.deadline is not None]
            sigs = tuple(sorted({p.signal for p in self._stuck_parks if p.signal}))
            return Suspended(min(wakes) if wakes else None, sigs)
        if body.cancelled():
            if self._cancel_requested:
                return Cancelled()
            return Failed(ErrorInfo(type="CancelledError", message="body was cancelled"))
        exc = body.exception()
        if exc is not None:
            if isinstance(exc, _Diverged):
                return Diverged(exc.args[0])
            if isinstance(exc, asyncio.CancelledError) and self._cancel_requested:
                return Cancelled()
            if isinstance(exc, _ControlFlow):
                return Evicted()
            return Failed(error_info(exc))
        unconsumed = sorted(set(self._index) - self._consumed)
        if unconsumed:
            pos = unconsumed[0]
            return Diverged(
                NonDeterminismError(
                    pos,
                    _describe(self._index[pos][0]),
                    None,
                    "the body returned before reaching it",
                )
            )
        try:
            data = _serde.to_json(body.result(), self.defn.output_adapter, what="workflow output")
        except SerializationError as err:
            return Failed(error_info(err))
        return Completed(data)
