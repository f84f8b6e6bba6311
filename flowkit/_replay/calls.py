"""The ctx calls of an activation: steps (with durable retries), timers, signals, gather.

``StepCalls`` is mixed into ``Activation``; it reaches the activation's bookkeeping (positions,
recorded events, parking) through the methods declared below."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from . import _serde
from ._activation_parts import (
    _BRANCH,
    _FOREIGN_TASK,
    Host,
    ReplayStub,
    _await,
    _Branch,
    _ControlFlow,
    _Evicted,
    _Group,
    _Guard,
    _silence,
    _StepCancelled,
    error_info,
)
from ._definition import RetryPolicy
from ._history import (
    ErrorInfo,
    Event,
    SignalReceived,
    StepCompleted,
    StepFailed,
    TimerFired,
    TimerStarted,
    step_completed,
)
from .errors import (
    SerializationError,
    SignalTimeout,
    StepFailedError,
)
from .stores.base import ConflictError

if TYPE_CHECKING:
    from pydantic import TypeAdapter

_STEP_KINDS: tuple[type[Event], ...] = (StepCompleted, StepFailed)


def _made_on_branch(aw: object, br: _Branch) -> bool:
    """Whether ``aw`` is a ctx call made on branch ``br`` that has not started."""
    if type(aw) is not CoroutineType or aw.cr_code not in _CALL_CODES or aw.cr_frame is None:
        return False
    return aw.cr_frame.f_locals.get("made_in") is br


class StepCalls:
    """Implementation of ``Runtime``'s ctx calls over the activation's history."""

    host: Host
    replay_only: bool
    _cancel_requested: bool
    _tearing_down: bool
    _step_tasks: set[asyncio.Future[Any]]
    _children: set[asyncio.Task[Any]]
    _cancelled_hosts: set[asyncio.Future[Any]]
    _live: int
    _blocked: int
    _index: dict[str, list[Event]]
    store_error: Exception | None

    if TYPE_CHECKING:

        def evict(self) -> None: ...

        def _branch(self) -> _Branch: ...

        def _take(
            self,
            pos: str,
            kinds: tuple[type[Event], ...],
            call: str,
            name: str,
            args: Callable[[], str] | None = None,
        ) -> list[Event]: ...

        def _observe(self, ev: Event) -> None: ...

        def _defer(self, event: Event) -> None: ...

        async def _flush(self) -> None: ...

        async def _record(
            self, events: Sequence[Event], consume_signal: int | None = None
        ) -> None: ...

        async def _park(self, deadline: float | None, signal: str | None = None) -> None: ...

        def _check_alive(self) -> None: ...

        def _check_stuck(self) -> None: ...

        def _stop_replay(self, pos: str, call: str) -> _Evicted: ...

        def _enter(self, made_in: _Branch, idx: int) -> _Branch: ...

        def _in_foreign_task(self) -> BaseException: ...

        def _running_branch(self, made_in: _Branch) -> _Branch: ...

        def _cancel_left(self, br: _Branch) -> None: ...

        def _unawaited(self, br: _Branch) -> BaseException: ...

        def _branch_done(self, br: _Branch) -> None: ...

        def _foreign_await(self, br: _Branch, it: object, yielded: object) -> BaseException: ...

        def _diverge(
            self, pos: str, recorded: str | None, call: str | None, detail: str = ""
        ) -> BaseException: ...

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
        if name is not None and not isinstance(name, str):
            raise TypeError(f"ctx.step name= takes a str, got {name!r}")
        cur = _BRANCH.get()
        if cur is None or cur[0] is not self:
            raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
        br: _Branch = cur[1]
        if not br.running:
            raise self._made_in_foreign_task(br)
        pos = br.next_pos()
        idx = br.counter
        coro: Coroutine[Any, Any, Any]
        if isinstance(fn, ReplayStub):  # an injected service stubbed out by replay()
            name = name or ReplayStub.ANY_NAME
            coro = self._step(br, idx, pos, fn, args, kwargs, name, retry, None)
        else:
            try:
                default, adapter = _serde.step_meta(fn)
            except BaseException:
                if idx == br.next:  # (the call failed as it was made: nothing to await)
                    br.next = idx + 1
                raise
            coro = self._step(br, idx, pos, fn, args, kwargs, name or default, retry, adapter)
        if idx == br.next:
            br.head = coro  # (for the report, should it never be awaited)
        return coro

    def _made_on(self) -> _Branch:
        """The branch a new ctx call takes its position on: the caller's, which must be
        executing its own coroutine (not a task it started). ``step`` inlines this."""
        br = self._branch()
        if not br.running:
            raise self._made_in_foreign_task(br)
        return br

    def _made_in_foreign_task(self, br: _Branch) -> BaseException:
        pos = f"{br.prefix}{br.counter + 1}"
        return self._diverge(pos, None, "a ctx call made in a task of its own", _FOREIGN_TASK)

    async def _step(
        self,
        made_in: _Branch,
        idx: int,
        pos: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str,
        retry: RetryPolicy | None,
        adapter: TypeAdapter[Any] | None,
    ) -> Any:
        # (the hot path of every run: no closures, and a position nothing was recorded at,
        # the live case, skips the history lookup)
        # (``_enter``, inlined: the hot path)
        br = made_in
        if br.running:
            if idx != br.next:
                raise self._unawaited(br)
            br.next = idx + 1
        else:
            br = self._running_branch(made_in)
        br.depth += 1
        try:
            if self._tearing_down:
                raise _Evicted()
            if adapter is None:
                adapter = _serde.ANY_ADAPTER
            # the arguments' digest, taken once per call (as they were when first needed):
            # every attempt's record carries the same one
            digest: str | None = None
            attempt = 1
            if pos in self._index:
                evs = self._take(
                    pos, _STEP_KINDS, "step", name, lambda: _serde.digest(args, kwargs)
                )
                if len(evs) == 1 and type(evs[0]) is StepCompleted:  # (replaying a success)
                    self._observe(evs[0])
                    return _serde.from_json(evs[0].result, adapter)
                failures = [e for e in evs if isinstance(e, StepFailed)]
                for ev in evs:
                    if isinstance(ev, StepCompleted):
                        self._observe(ev)
                        return _serde.from_json(ev.result, adapter)
                if failures:
                    last = failures[-1]
                    self._observe(last)
                    if last.cancelled:  # the cancellation was delivered here
                        raise asyncio.CancelledError()
                    if last.retry_at is None:
                        raise StepFailedError(
                            name, last.error.type, last.error.message, last.attempt
                        )
                    if self._cancel_requested:  # a backoff is a durable wait
                        raise asyncio.CancelledError()
                    if last.retry_at > self.host.now():
                        await self._park(last.retry_at)
                attempt = len(failures) + 1

            while True:
                if self._tearing_down:
                    raise _Evicted()
                if self.replay_only:
                    raise self._stop_replay(pos, f"step({name!r})")
                await self._flush()  # earlier outcomes are durable before this side effect
                if self._cancel_requested and not br.delivered:
                    # Deliver the cancellation here, in place of the step: recorded (as a
                    # cancelled attempt that never started), so that a replay raises it here
                    # again from the history alone.
                    info = ErrorInfo(
                        type="CancelledError",
                        message="cancelled before it started",
                        step=name,
                        attempts=attempt,
                    )
                    digest = digest or _serde.digest(args, kwargs)
                    await self._step_failed(pos, name, attempt, digest, info, cancelled=True)
                    raise asyncio.CancelledError()
                try:
                    result = await self._execute(fn, args, kwargs)
                except _StepCancelled:
                    info = ErrorInfo(
                        type="CancelledError", message="cancelled", step=name, attempts=attempt
                    )
                    digest = digest or _serde.digest(args, kwargs)
                    await self._step_failed(pos, name, attempt, digest, info, cancelled=True)
                    raise asyncio.CancelledError() from None
                except asyncio.CancelledError as exc:
                    task = asyncio.current_task()
                    if self._tearing_down or (task is not None and task.cancelling()):
                        raise  # a teardown, or a cancellation from elsewhere (_cancel_left)
                    # the step raised it although nothing cancelled it: its own failure
                    digest = digest or _serde.digest(args, kwargs)
                    retry_at = await self._attempt_failed(exc, pos, name, attempt, digest, retry)
                except _ControlFlow:
                    raise
                except Exception as exc:
                    digest = digest or _serde.digest(args, kwargs)
                    retry_at = await self._attempt_failed(exc, pos, name, attempt, digest, retry)
                else:
                    # a plain result is its own JSON form and comes back unchanged (as replay
                    # returns it)
                    plain = _serde.plain_for(result, adapter)
                    try:
                        data = (
                            result
                            if plain
                            else _serde.to_json(result, adapter, what=f"result of step {name!r}")
                        )
                    except SerializationError as exc:
                        info = error_info(exc, name, attempt)
                        digest = digest or _serde.digest(args, kwargs)
                        await self._step_failed(pos, name, attempt, digest, info)
                        raise StepFailedError(name, info.type, info.message, attempt) from exc
                    if digest is None:
                        digest = _serde.digest(args, kwargs)
                    self._defer(step_completed(pos, name, attempt, data, digest, self.host.now()))
                    return result if plain else _serde.from_json(data, adapter)
                if self._cancel_requested:  # a backoff is a durable wait
                    raise asyncio.CancelledError()
                if retry_at > self.host.now():
                    await self._park(retry_at)
                attempt += 1
        except asyncio.CancelledError:
            self._cancel_left(br)
            raise
        finally:
            br.depth -= 1

    async def _attempt_failed(
        self,
        exc: BaseException,
        pos: str,
        name: str,
        attempt: int,
        digest: str,
        retry: RetryPolicy | None,
    ) -> float:
        """Record the failed ``attempt``: the time of the next one when ``retry`` allows one,
        else ``StepFailedError``."""
        info = error_info(exc, name, attempt)
        if retry is not None and retry.retries(exc, attempt):
            retry_at = round(self.host.now() + retry.delay_before(attempt + 1), 6)
            await self._step_failed(pos, name, attempt, digest, info, retry_at)
            return retry_at
        await self._step_failed(pos, name, attempt, digest, info)
        raise StepFailedError(name, info.type, info.message, attempt) from exc

    async def _step_failed(
        self,
        pos: str,
        name: str,
        attempt: int,
        digest: str,
        info: ErrorInfo,
        retry_at: float | None = None,
        cancelled: bool = False,
    ) -> None:
        """Record a failed attempt of the step at ``pos``."""
        await self._record(
            [
                StepFailed(
                    pos=pos,
                    name=name,
                    attempt=attempt,
                    error=info,
                    retry_at=retry_at,
                    cancelled=cancelled,
                    args_digest=digest,
                    at=self.host.now(),
                )
            ]
        )

    async def _execute(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Call the step function; ``_StepCancelled`` when ``request_cancel`` cancelled it."""
        value = fn(*args, **kwargs)
        if type(value) is not CoroutineType and (
            not asyncio.iscoroutine(value) and not isinstance(value, asyncio.Future)
        ):
            if isinstance(value, Awaitable):
                value = _await(value)
            else:
                return value
        if type(value) is not CoroutineType and not asyncio.iscoroutine(value):
            fut = asyncio.ensure_future(value)
            self._step_tasks.add(fut)
            try:
                return await fut
            except asyncio.CancelledError:
                if fut in self._cancelled_hosts:
                    raise _StepCancelled() from None
                raise
            finally:
                self._step_tasks.discard(fut)
                self._cancelled_hosts.discard(fut)
        # a coroutine runs inline, in the task of the branch that awaits it (as a plain
        # ``await`` would): no task of its own, no extra turn of the event loop per step.
        # Cancelling the step cancels that task while it is inside the step (request_cancel)
        host = asyncio.current_task()
        assert host is not None
        self._step_tasks.add(host)
        try:
            return await value
        except asyncio.CancelledError:
            if host in self._cancelled_hosts:
                raise _StepCancelled() from None
            raise
        finally:
            self._step_tasks.discard(host)
            if host in self._cancelled_hosts:
                self._cancelled_hosts.discard(host)
                host.uncancel()

    def sleep(self, seconds: float) -> Coroutine[Any, Any, None]:
        if not isinstance(seconds, int | float) or seconds < 0 or seconds != seconds:
            raise ValueError(f"ctx.sleep needs seconds >= 0, got {seconds!r}")
        br = self._made_on()
        pos = br.next_pos()
        coro = self._sleep(br, br.counter, pos, None, float(seconds))
        if br.counter == br.next:
            br.head = coro
        return coro

    def sleep_until(self, fire_at: float) -> Coroutine[Any, Any, None]:
        br = self._made_on()
        pos = br.next_pos()
        coro = self._sleep(br, br.counter, pos, fire_at, None)
        if br.counter == br.next:
            br.head = coro
        return coro

    async def _sleep(
        self, made_in: _Branch, idx: int, pos: str, fire_at: float | None, seconds: float | None
    ) -> None:
        br = self._enter(made_in, idx)
        try:
            self._check_alive()
            evs = self._take(pos, (TimerStarted, TimerFired), "sleep", "sleep")
            started = next((e for e in evs if isinstance(e, TimerStarted)), None)
            fired = next((e for e in evs if isinstance(e, TimerFired)), None)
            if fired is not None:
                self._observe(fired)
                return
            if self._cancel_requested:  # (also a timer that is due by now: it did not fire)
                raise asyncio.CancelledError()
            if started is None:
                now = self.host.now()
                target = round(fire_at if fire_at is not None else now + (seconds or 0.0), 6)
                started = TimerStarted(pos=pos, fire_at=target, at=now)
                await self._record([started])
            if started.fire_at > self.host.now():
                await self._park(started.fire_at)
            await self._record([TimerFired(pos=pos, at=self.host.now())])
        except asyncio.CancelledError:
            self._cancel_left(br)
            raise
        finally:
            br.depth -= 1

    def wait_for_signal(self, name: str, timeout: float | None) -> Coroutine[Any, Any, Any]:
        if not isinstance(name, str) or not name:
            raise ValueError("signal name must be a non-empty string")
        if timeout is not None and (timeout < 0 or timeout != timeout):
            raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
        br = self._made_on()
        pos = br.next_pos()
        coro = self._wait_signal(br, br.counter, pos, name, timeout)
        if br.counter == br.next:
            br.head = coro
        return coro

    async def _wait_signal(
        self, made_in: _Branch, idx: int, pos: str, name: str, timeout: float | None
    ) -> Any:
        br = self._enter(made_in, idx)
        try:
            return await self._wait_signal_in(pos, name, timeout)
        except asyncio.CancelledError:
            self._cancel_left(br)
            raise
        finally:
            br.depth -= 1

    async def _wait_signal_in(self, pos: str, name: str, timeout: float | None) -> Any:
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
            if self._cancel_requested:  # (before the inbox: a signal there is not taken)
                raise asyncio.CancelledError()
            try:
                sig = await self.host.peek_signal(name)
            except Exception as exc:
                self.store_error = exc
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
        parent = self._made_on()
        g = parent.next_pos()
        # the parent's calls not started yet must be ctx calls given here: its children run them
        waiting = parent.counter - parent.next
        if waiting and sum(_made_on_branch(aw, parent) for aw in aws) != waiting:
            raise self._unawaited(parent)
        parent.next = parent.counter + 1
        parent.depth += 1
        try:
            return await self._gather(parent, g, aws)
        except asyncio.CancelledError:
            self._cancel_left(parent)
            raise
        finally:
            parent.depth -= 1

    async def _gather(self, parent: _Branch, g: str, aws: tuple[Awaitable[Any], ...]) -> list[Any]:
        group = _Group(remaining=len(aws))
        if not aws:
            return []
        children = [
            _Branch(
                prefix=f"{g}.{i}/",
                now_at=parent.now_at,
                seed=parent.rng.getrandbits(64),
                delivered=parent.delivered,
            )
            for i in range(len(aws))
        ]
        tasks = []
        self._live += len(aws)
        for child, aw in zip(children, aws, strict=True):
            task = asyncio.ensure_future(self._child(child, aw, group))
            self._children.add(task)
            task.add_done_callback(self._child_ended)
            tasks.append(task)
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

    def _child_ended(self, task: asyncio.Task[Any]) -> None:
        self._children.discard(task)
        # (read, so that the outcome of a child whose gather was interrupted, and is nobody's
        # now, is not logged as "never retrieved"; the gather reads it as usual otherwise)
        _silence(task)

    async def _child(self, branch: _Branch, aw: Awaitable[Any], group: _Group) -> Any:
        _BRANCH.set((self, branch))
        try:
            return await _Guard(aw, branch, self._foreign_await)
        finally:
            self._live -= 1
            self._branch_done(branch)
            group.remaining -= 1
            if group.remaining == 0 and not group.parent_unblocked:
                group.parent_unblocked = True
                self._blocked -= 1
            self._check_stuck()


_CALL_CODES = frozenset(
    {StepCalls._step.__code__, StepCalls._sleep.__code__, StepCalls._wait_signal.__code__}
)
