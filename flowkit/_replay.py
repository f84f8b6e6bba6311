"""Deterministic execution of a workflow body over its history (one *activation*).

The body re-executes from the top; each ctx call takes the next position of its branch (the
body is branch ``""``; ``ctx.gather`` children get ``"<pos>.<i>/"``), so positions never depend
on timing. A call whose position has recorded events returns/raises the recorded outcome; a new
call runs and records. When every live branch waits on a durable wait that this activation
cannot satisfy (a timer not yet due, a signal not yet sent, a retry backoff) the activation is
*stuck*: it tears the body down and reports ``Suspended`` with the earliest wake time."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from . import _serde
from ._context import WorkflowCtx
from ._definition import RetryPolicy, WorkflowDefinition
from ._history import (
    ErrorInfo,
    Event,
    RunRetried,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
)
from .errors import (
    LeaseLostError,
    NonDeterminismError,
    SerializationError,
    SignalTimeout,
    StepFailedError,
)
from .stores.base import ConflictError, InboxSignal


class _ControlFlow(BaseException):
    """Base of internal control-flow signals; a user's ``except Exception`` cannot swallow them."""


class _Evicted(_ControlFlow):
    """The activation is being torn down (suspension, lease lost, replay end)."""


class _Diverged(_ControlFlow):
    """The body diverged from its history; carries the ``NonDeterminismError``."""


class ReplayStub:
    """Stands in for services a workflow got through its constructor when ``replay`` is
    given a class it cannot construct: replay never calls steps, so any attribute path will
    do, and such steps are matched by position and kind only."""

    ANY_NAME = "<replay-stub>"

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> ReplayStub:
        if name.startswith("__"):
            raise AttributeError(name)
        return ReplayStub(f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"replay never executes steps ({self._path} was called)")


class Host(Protocol):
    """What an activation needs from the engine: time, durable appends, the signal inbox."""

    def now(self) -> float: ...

    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> bool:
        """Append events under the lease; returns whether cancellation was requested."""
        ...

    async def peek_signal(self, name: str) -> InboxSignal | None: ...


# -- outcomes --------------------------------------------------------------------------
@dataclass(frozen=True)
class Completed:
    output: Any


@dataclass(frozen=True)
class Failed:
    error: ErrorInfo


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class Suspended:
    wake_at: float | None
    signals: tuple[str, ...]


@dataclass(frozen=True)
class Diverged:
    error: NonDeterminismError


@dataclass(frozen=True)
class Evicted:
    pass


Outcome = Completed | Failed | Cancelled | Suspended | Diverged | Evicted


@dataclass
class _Branch:
    prefix: str
    now_at: float
    rng: random.Random
    counter: int = 0

    def next_pos(self) -> str:
        self.counter += 1
        return f"{self.prefix}{self.counter}"


@dataclass
class _Park:
    deadline: float | None
    signal: str | None
    fut: asyncio.Future[None]


@dataclass
class _Group:
    remaining: int
    parent_unblocked: bool = False


_BRANCH: contextvars.ContextVar[tuple[Activation, _Branch] | None] = contextvars.ContextVar(
    "flowkit_branch", default=None
)


def _seed(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode()).digest()[:8], "big")


def _describe(ev: Event) -> str:
    name = getattr(ev, "name", None)
    text = f"{ev.type}#{ev.seq}"
    if name:
        digest = getattr(ev, "args_digest", None)
        text += f"({name!r}" + (f", args {digest}" if digest else "") + ")"
    pos = getattr(ev, "pos", None)
    return text + (f" at position {pos}" if pos is not None else "")


def error_info(
    exc: BaseException, step: str | None = None, attempts: int | None = None
) -> ErrorInfo:
    if isinstance(exc, StepFailedError):
        return ErrorInfo(
            type="StepFailedError",
            message=str(exc),
            step=exc.step,
            attempts=exc.attempts,
            cause_type=exc.error_type,
            cause_message=exc.message,
        )
    return ErrorInfo(type=type(exc).__name__, message=str(exc), step=step, attempts=attempts)


class Activation:
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
        for ev in events:
            if isinstance(ev, RunStarted):
                self._start_at = ev.at
            elif isinstance(ev, RunRetried):
                self._forget_final_failures()
            pos = getattr(ev, "pos", None)
            if pos is not None:
                self._index.setdefault(pos, []).append(ev)
        self._live = 0
        self._blocked = 0
        self._parks: list[_Park] = []
        self._step_tasks: set[asyncio.Task[Any]] = set()
        self._done = asyncio.Event()
        self._cancel_requested = cancel_requested
        self._tearing_down = False
        self._evicted = False
        self._divergence: NonDeterminismError | None = None
        self._stuck_parks: list[_Park] = []
        self._body_task: asyncio.Task[Any] | None = None
        self._store_error: Exception | None = None

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
        """Deliver cancellation: parked waits raise ``CancelledError``, running steps are
        cancelled; later durable waits raise at once, steps still run (for cleanup)."""
        if self._cancel_requested:
            return
        self._cancel_requested = True
        for park in list(self._parks):
            if not park.fut.done():
                park.fut.set_exception(asyncio.CancelledError())
        for t in list(self._step_tasks):
            t.cancel()

    def evict(self) -> None:
        """Stop at once without recording anything more (lease lost, engine stopping): the
        body and its running steps are cancelled, as a dying process would lose them."""
        self._evicted = True
        self._tearing_down = True
        self._done.set()
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

    def _check_alive(self) -> None:
        if self._tearing_down:
            raise _Evicted()

    def _check_stuck(self) -> None:
        if self._live > 0 and self._blocked >= self._live and self._parks:
            self._done.set()

    def _diverge(
        self, pos: str, recorded: str | None, call: str | None, detail: str = ""
    ) -> _Diverged:
        if self._divergence is None:
            self._divergence = NonDeterminismError(pos, recorded, call, detail, self._window(pos))
        self._done.set()
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
        try:
            cancel = await self.host.record(events, consume_signal)
        except LeaseLostError:
            self.evict()
            raise _Evicted() from None
        except ConflictError:
            if consume_signal is not None:
                raise  # the signal went to a racing activation: the caller looks again
            self.evict()
            raise _Evicted() from None
        except Exception as exc:
            # The store failed: nothing more may run on a history we could not extend. The
            # activation stops; the lease expires and recovery replays the run.
            self._store_error = exc
            self.evict()
            raise _Evicted() from exc
        for ev in events:
            self._observe(ev)
        if cancel:
            self.request_cancel()

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

    # -- ctx calls ---------------------------------------------------------------------
    def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None,
        retry: RetryPolicy | None,
    ) -> Coroutine[Any, Any, Any]:
        if not callable(fn):
            raise TypeError(f"ctx.step needs a callable, got {fn!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError("retry= takes a flowkit.RetryPolicy")
        pos = self._branch().next_pos()
        if name is None and isinstance(fn, ReplayStub):
            name = ReplayStub.ANY_NAME  # an injected service stubbed out by replay()
        return self._step(pos, fn, args, kwargs, name or _serde.step_name(fn), retry)

    async def _step(
        self,
        pos: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        retry: RetryPolicy | None,
    ) -> Any:
        self._check_alive()
        adapter = _serde.ANY_ADAPTER if isinstance(fn, ReplayStub) else _serde.return_adapter(fn)
        dg: list[str] = []

        def args_digest() -> str:
            if not dg:
                dg.append(_serde.digest(args, kwargs))
            return dg[0]

        evs = self._take(pos, (StepCompleted, StepFailed), "step", name, args_digest)
        failures = [e for e in evs if isinstance(e, StepFailed)]
        for ev in evs:
            if isinstance(ev, StepCompleted):
                self._observe(ev)
                return _serde.from_json(ev.result, adapter)
        if failures:
            last = failures[-1]
            self._observe(last)
            if last.cancelled:
                raise asyncio.CancelledError()
            if last.retry_at is None:
                raise StepFailedError(name, last.error.type, last.error.message, last.attempt)
            if last.retry_at > self.host.now():
                await self._park(last.retry_at)
        attempt = len(failures) + 1
        while True:
            self._check_alive()
            if self.replay_only:
                raise self._stop_replay(pos, f"step({name!r})")
            try:
                result = await self._execute(fn, args, kwargs)
            except asyncio.CancelledError:
                if not self._cancel_requested or self._tearing_down:
                    raise
                info = ErrorInfo(
                    type="CancelledError", message="cancelled", step=name, attempts=attempt
                )
                await self._record(
                    [
                        StepFailed(
                            pos=pos,
                            args_digest=args_digest(),
                            name=name,
                            attempt=attempt,
                            error=info,
                            cancelled=True,
                            at=self.host.now(),
                        )
                    ]
                )
                raise
            except _ControlFlow:
                raise
            except Exception as exc:
                now = self.host.now()
                if retry is not None and retry.retries(exc, attempt):
                    retry_at = round(now + retry.delay_before(attempt + 1), 6)
                    info = error_info(exc, name, attempt)
                    await self._record(
                        [
                            StepFailed(
                                pos=pos,
                                args_digest=args_digest(),
                                name=name,
                                attempt=attempt,
                                error=info,
                                retry_at=retry_at,
                                at=now,
                            )
                        ]
                    )
                    if retry_at > self.host.now():
                        await self._park(retry_at)
                    attempt += 1
                    continue
                info = error_info(exc, name, attempt)
                await self._record(
                    [
                        StepFailed(
                            pos=pos,
                            name=name,
                            attempt=attempt,
                            error=info,
                            at=now,
                            args_digest=args_digest(),
                        )
                    ]
                )
                raise StepFailedError(name, info.type, info.message, attempt) from exc
            try:
                data = _serde.to_json(result, adapter, what=f"result of step {name!r}")
            except SerializationError as exc:
                info = error_info(exc, name, attempt)
                await self._record(
                    [
                        StepFailed(
                            pos=pos,
                            args_digest=args_digest(),
                            name=name,
                            attempt=attempt,
                            error=info,
                            at=self.host.now(),
                        )
                    ]
                )
                raise StepFailedError(name, info.type, info.message, attempt) from exc
            await self._record(
                [
                    StepCompleted(
                        pos=pos,
                        args_digest=args_digest(),
                        name=name,
                        attempt=attempt,
                        result=data,
                        at=self.host.now(),
                    )
                ]
            )
            return _serde.from_json(data, adapter)

    async def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        value = fn(*args, **kwargs)
        if not asyncio.iscoroutine(value) and not isinstance(value, asyncio.Future):
            if isinstance(value, Awaitable):
                value = _await(value)
            else:
                return value
        task = asyncio.ensure_future(value)
        self._step_tasks.add(task)
        try:
            return await task
        finally:
            self._step_tasks.discard(task)

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        if not isinstance(seconds, int | float) or seconds < 0 or seconds != seconds:
            raise ValueError(f"ctx.sleep needs seconds >= 0, got {seconds!r}")
        pos = self._branch().next_pos()
        return self._sleep(pos, None, float(seconds))

    def sleep_until(self, fire_at: float) -> Coroutine[Any, Any, None]:
        pos = self._branch().next_pos()
        return self._sleep(pos, fire_at, None)

    async def _sleep(self, pos: str, fire_at: float | None, seconds: float | None) -> None:
        self._check_alive()
        evs = self._take(pos, (TimerStarted, TimerFired), "sleep", "sleep")
        started = next((e for e in evs if isinstance(e, TimerStarted)), None)
        fired = next((e for e in evs if isinstance(e, TimerFired)), None)
        if fired is not None:
            self._observe(fired)
            return
        if started is None:
            if self._cancel_requested:
                raise asyncio.CancelledError()
            now = self.host.now()
            target = round(fire_at if fire_at is not None else now + (seconds or 0.0), 6)
            started = TimerStarted(pos=pos, fire_at=target, at=now)
            await self._record([started])
        if started.fire_at > self.host.now():
            await self._park(started.fire_at)
        await self._record([TimerFired(pos=pos, at=self.host.now())])

    def wait_for_signal(self, name: str, timeout: float | None) -> Coroutine[Any, Any, Any]:
        if not isinstance(name, str) or not name:
            raise ValueError("signal name must be a non-empty string")
        if timeout is not None and (timeout < 0 or timeout != timeout):
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
        pos = self._branch().next_pos()
        return self._wait_signal(pos, name, timeout)

    async def _wait_signal(self, pos: str, name: str, timeout: float | None) -> Any:
        self._check_alive()
        evs = self._take(pos, (SignalReceived, TimerStarted, TimerFired), "wait_for_signal", name)
        for ev in evs:
            if isinstance(ev, SignalReceived):
                self._observe(ev)
                return ev.payload
        timer = next((e for e in evs if isinstance(e, TimerStarted)), None)
        fired = next((e for e in evs if isinstance(e, TimerFired)), None)
        if fired is not None:
            self._observe(fired)
            raise SignalTimeout(name, timeout if timeout is not None else 0.0)
        while True:
            self._check_alive()
            try:
                sig = await self.host.peek_signal(name)
            except Exception as exc:
                self._store_error = exc
                self.evict()
                raise _Evicted() from exc
            if sig is not None:
                try:
                    await self._record(
                        [
                            SignalReceived(
                                pos=pos, name=name, payload=sig.payload, at=self.host.now()
                            )
                        ],
                        consume_signal=sig.id,
                    )
                except ConflictError:
                    continue  # consumed by a racing activation; look again
                return sig.payload
            now = self.host.now()
            if self._cancel_requested:
                raise asyncio.CancelledError()
            if timeout is not None and timer is None:
                timer = TimerStarted(
                    pos=pos, fire_at=round(now + timeout, 6), purpose="signal_timeout", at=now
                )
                await self._record([timer])
            if timer is not None and timer.fire_at <= now:
                await self._record([TimerFired(pos=pos, at=now)])
                raise SignalTimeout(name, timeout if timeout is not None else 0.0)
            await self._park(timer.fire_at if timer else None, name)

    async def gather(self, aws: tuple[Awaitable[Any], ...]) -> list[Any]:
        parent = self._branch()
        g = parent.next_pos()
        group = _Group(remaining=len(aws))
        if not aws:
            return []
        children = [
            _Branch(
                prefix=f"{g}.{i}/",
                now_at=parent.now_at,
                rng=random.Random(parent.rng.getrandbits(64)),
            )
            for i in range(len(aws))
        ]
        tasks = []
        self._live += len(aws)
        for child, aw in zip(children, aws, strict=True):
            tasks.append(asyncio.ensure_future(self._child(child, aw, group)))
        self._blocked += 1
        try:
            await asyncio.wait(tasks)
        finally:
            if not group.parent_unblocked:
                group.parent_unblocked = True
                self._blocked -= 1
        for child in children:
            parent.now_at = max(parent.now_at, child.now_at)
        # Read every child's outcome (so none is reported as never retrieved), then raise the
        # first failure by argument order, so a replay raises the same one.
        outcomes = [asyncio.CancelledError() if t.cancelled() else t.exception() for t in tasks]
        for exc in outcomes:
            if exc is not None:
                raise exc
        return [t.result() for t in tasks]

    async def _child(self, branch: _Branch, aw: Awaitable[Any], group: _Group) -> Any:
        _BRANCH.set((self, branch))
        try:
            return await aw
        finally:
            self._live -= 1
            group.remaining -= 1
            if group.remaining == 0 and not group.parent_unblocked:
                group.parent_unblocked = True
                self._blocked -= 1
            self._check_stuck()

    # -- the activation ----------------------------------------------------------------
    async def _body(self) -> Any:
        root = _Branch(prefix="", now_at=self._start_at, rng=random.Random(_seed(self.run_id)))
        _BRANCH.set((self, root))
        try:
            return await self.instance.run(WorkflowCtx(self), self.input_value)
        finally:
            self._live -= 1
            self._done.set()

    async def run(self) -> Outcome:
        """Execute the body until it settles or gets stuck; never raises for body errors."""
        self._live = 1
        body = self._body_task = asyncio.ensure_future(self._body())
        done_wait = asyncio.ensure_future(self._done.wait())
        try:
            await asyncio.wait({body, done_wait}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.evict()  # our worker is going away: so does the body
            raise
        finally:
            done_wait.cancel()
        self._stuck_parks = list(self._parks)
        if not body.done():
            await self._teardown(body)
        return self._outcome(body)

    async def _teardown(self, body: asyncio.Task[Any]) -> None:
        self._tearing_down = True
        for park in list(self._parks):
            if not park.fut.done():
                park.fut.set_exception(_Evicted())
        for t in list(self._step_tasks):
            t.cancel()
        if not body.done():
            # Give the body its chance to unwind through its parked awaits.
            for _ in range(100):
                await asyncio.sleep(0)
                if body.done():
                    break
            else:
                body.cancel()
                await asyncio.wait({body})

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


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _silence(task: asyncio.Task[Any]) -> None:
    if task.done() and not task.cancelled():
        task.exception()
