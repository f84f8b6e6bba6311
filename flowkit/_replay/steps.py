"""The step call: a step function run once and its outcome recorded, or its recorded outcome
returned on replay; failed attempts retried after a durable backoff (``RetryPolicy``); the
run's cancellation delivered in place of a step not started yet, or into a running one.

An async step function runs inline in the task of its branch; a sync one in a step thread
(``Host.in_thread``), never on the event loop. ``timeout=`` bounds each attempt on the
engine's clock (``_Timeout``): the attempt is cancelled (a thread is abandoned) and fails with
``StepTimeoutError``, recorded as any failure, so that a replay takes the same branch."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from types import CoroutineType
from typing import TYPE_CHECKING, Any

from .._core import serde as _serde
from .._model.definition import RetryPolicy
from .._model.history import step_completed
from ..errors import SerializationError, StepFailedError, StepTimeoutError
from ..events import ErrorInfo, StepCompleted, StepFailed
from .branch import Branch
from .control_flow import _ControlFlow, _Evicted, _StepCancelled
from .guard import cancel_left, running_branch, unawaited
from .outcome import error_info
from .state import ActivationState, Undo

if TYPE_CHECKING:
    from pydantic import TypeAdapter


async def run_step(
    st: ActivationState,
    made_in: Branch,
    idx: int,
    pos: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    name: str,
    retry: RetryPolicy | None,
    adapter: TypeAdapter[Any] | None,
    is_async: bool = True,
    timeout: float | None = None,
    undo: Callable[[Any], Any] | None = None,
) -> Any:
    """The step at ``pos`` (call ``idx`` of ``made_in``): its recorded outcome, else ``fn``
    run (again after each failed attempt's backoff, as ``retry`` allows; each attempt within
    ``timeout``) and recorded. ``is_async``: ``fn`` only creates a coroutine (else it runs in
    a step thread). ``undo``: registered as its compensation once it completed (recorded or
    now), ordered by its completion (``compensation.py``)."""
    # (the hot path of every run: no closures, and a position nothing was recorded at,
    # the live case, skips the history lookup)
    # (``enter``, inlined: the hot path)
    br = made_in
    if br.running:
        if idx != br.next:
            raise unawaited(st, br)
        br.next = idx + 1
    else:
        br = running_branch(st, made_in)
    br.depth += 1
    try:
        if st.tearing_down:
            raise _Evicted()
        if adapter is None:
            adapter = _serde.ANY_ADAPTER
        # the arguments' digest, taken once per call (as they were when first needed):
        # every attempt's record carries the same one
        digest: str | None = None
        attempt = 1
        if pos in st.index:
            evs = st.take(pos, "step", name, args, kwargs)
            if len(evs) == 1 and type(evs[0]) is StepCompleted:  # (replaying a success)
                done = evs[0]
                if done.at > br.now_at:  # (``st.observe``: ``br`` is the running branch)
                    br.now_at = done.at
                value = _serde.from_json(done.result, adapter)
                if undo is not None:
                    st.undos.append(Undo((0, done.seq), pos, undo, value, retry, timeout))
                return value
            failures = [e for e in evs if isinstance(e, StepFailed)]
            for ev in evs:
                if isinstance(ev, StepCompleted):
                    st.observe(ev)
                    value = _serde.from_json(ev.result, adapter)
                    if undo is not None:
                        st.undos.append(Undo((0, ev.seq), pos, undo, value, retry, timeout))
                    return value
            if failures:
                last = failures[-1]
                st.observe(last)
                if last.cancelled:  # the cancellation was delivered here
                    raise asyncio.CancelledError()
                if last.retry_at is None:
                    raise StepFailedError(name, last.error.type, last.error.message, last.attempt)
                if st.cancel_requested:  # a backoff is a durable wait
                    raise asyncio.CancelledError()
                if last.retry_at > st.host.now():
                    await st.park(last.retry_at)
            attempt = len(failures) + 1

        while True:
            if st.tearing_down:
                raise _Evicted()
            if st.replay_only:
                raise st.stop_replay(pos, f"step({name!r})")
            await st.flush()  # earlier outcomes are durable before this side effect
            if st.draining:  # (the worker drains: stop at this durable point)
                raise await st.stop_draining()
            if st.cancel_requested and not br.delivered:
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
                await _step_failed(st, pos, name, attempt, digest, info, cancelled=True)
                raise asyncio.CancelledError()
            st.check_lease()  # (after the flush: a write may take a while)
            try:
                if st.telemetry is not None:  # (observed: ``_core/telemetry.py``)
                    result = await _observed(st, fn, args, kwargs, is_async, name, timeout, attempt)
                elif timeout is None:
                    result = await _execute(st, fn, args, kwargs, is_async)
                else:
                    result = await _timed(st, fn, args, kwargs, is_async, name, timeout)
            except _StepCancelled:
                info = ErrorInfo(
                    type="CancelledError", message="cancelled", step=name, attempts=attempt
                )
                digest = digest or _serde.digest(args, kwargs)
                await _step_failed(st, pos, name, attempt, digest, info, cancelled=True)
                raise asyncio.CancelledError() from None
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if st.tearing_down or (task is not None and task.cancelling()):
                    raise  # a teardown, or a cancellation from elsewhere (cancel_left)
                # the step raised it although nothing cancelled it: its own failure
                digest = digest or _serde.digest(args, kwargs)
                retry_at = await _attempt_failed(st, exc, pos, name, attempt, digest, retry)
            except _ControlFlow:
                raise
            except Exception as exc:
                digest = digest or _serde.digest(args, kwargs)
                retry_at = await _attempt_failed(st, exc, pos, name, attempt, digest, retry)
            else:
                # a plain result is its own JSON form and comes back unchanged (as replay
                # returns it)
                limit = st.max_payload_bytes
                plain = _serde.plain_for(result, adapter, limit)
                try:
                    data = (
                        result
                        if plain
                        else _serde.to_json(
                            result, adapter, what=f"result of step {name!r}", max_bytes=limit
                        )
                    )
                except SerializationError as exc:
                    info = error_info(exc, name, attempt)
                    digest = digest or _serde.digest(args, kwargs)
                    await _step_failed(st, pos, name, attempt, digest, info)
                    raise StepFailedError(name, info.type, info.message, attempt) from exc
                if digest is None:
                    digest = _serde.digest(args, kwargs)
                st.defer(step_completed(pos, name, attempt, data, digest, st.host.now()))
                if st.draining:  # (a drain waits for running steps: write it now, not later)
                    await st.flush()
                value = result if plain else _serde.from_json(data, adapter)
                if undo is not None:  # (after every recorded completion: see ``Undo.order``)
                    st.undos.append(Undo((1, len(st.undos)), pos, undo, value, retry, timeout))
                return value
            if st.cancel_requested:  # a backoff is a durable wait
                raise asyncio.CancelledError()
            if retry_at > st.host.now():
                await st.park(retry_at)
            attempt += 1
    except asyncio.CancelledError:
        cancel_left(st, br)
        raise
    finally:
        br.depth -= 1


async def _attempt_failed(
    st: ActivationState,
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
        retry_at = round(st.host.now() + retry.delay_before(attempt + 1), 6)
        await _step_failed(st, pos, name, attempt, digest, info, retry_at)
        return retry_at
    await _step_failed(st, pos, name, attempt, digest, info)
    raise StepFailedError(name, info.type, info.message, attempt) from exc


async def _step_failed(
    st: ActivationState,
    pos: str,
    name: str,
    attempt: int,
    digest: str,
    info: ErrorInfo,
    retry_at: float | None = None,
    cancelled: bool = False,
) -> None:
    """Record a failed attempt of the step at ``pos``."""
    await st.record(
        [
            StepFailed(
                pos=pos,
                name=name,
                attempt=attempt,
                error=info,
                retry_at=retry_at,
                cancelled=cancelled,
                args_digest=digest,
                at=st.host.now(),
            )
        ]
    )


async def _observed(
    st: ActivationState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    is_async: bool,
    name: str,
    timeout: float | None,
    attempt: int,
) -> Any:
    """One attempt of the step, as ``run_step`` makes it, told to the activation's observer
    (its span is the current one while it runs, in a step thread too)."""
    assert st.telemetry is not None
    obs = st.telemetry.step(name, attempt)
    if not is_async:  # (the thread runs in a copy of this context: the step's span)
        fn = functools.partial(contextvars.copy_context().run, fn)
    try:
        if timeout is None:
            result = await _execute(st, fn, args, kwargs, is_async)
        else:
            result = await _timed(st, fn, args, kwargs, is_async, name, timeout)
    except BaseException as exc:
        obs.end(exc)
        raise
    obs.end(None)
    return result


async def _execute(
    st: ActivationState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    is_async: bool = True,
) -> Any:
    """Call the step function; ``_StepCancelled`` when ``request_cancel`` cancelled it. The
    attempt is in flight (``Host.step_began``) until it ends, whichever way."""
    token = st.host.step_began()
    try:
        value = fn(*args, **kwargs) if is_async else await _in_thread(st, fn, args, kwargs)
        if type(value) is not CoroutineType and (
            not asyncio.iscoroutine(value) and not isinstance(value, asyncio.Future)
        ):
            if isinstance(value, Awaitable):
                value = _await(value)
            else:
                return value
        if type(value) is not CoroutineType and not asyncio.iscoroutine(value):
            fut = asyncio.ensure_future(value)
            st.step_tasks.add(fut)
            try:
                return await fut
            except asyncio.CancelledError:
                if fut in st.cancelled_hosts:
                    raise _StepCancelled() from None
                raise
            finally:
                st.step_tasks.discard(fut)
                st.cancelled_hosts.discard(fut)
                del fut  # (it holds what the step raised, whose traceback holds this frame)
        # a coroutine runs inline, in the task of the branch that awaits it (as a plain
        # ``await`` would): no task of its own, no extra turn of the event loop per step.
        # Cancelling the step cancels that task while it is inside the step (request_cancel)
        host = asyncio.current_task()
        assert host is not None
        st.step_tasks.add(host)
        try:
            return await value
        except asyncio.CancelledError:
            if host in st.cancelled_hosts:
                raise _StepCancelled() from None
            raise
        finally:
            st.step_tasks.discard(host)
            if host in st.cancelled_hosts:
                st.cancelled_hosts.discard(host)
                host.uncancel()
            # (this frame is in the traceback of what the step raised, which the task may keep
            # as its outcome: no local may hold the task, a cycle only the cyclic GC would free)
            del host
    finally:
        st.host.step_ended(token)


async def _in_thread(
    st: ActivationState, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call a sync step function in a step thread, the branch's task waiting for it; when the
    wait is cancelled (the run's cancellation, a timeout, a teardown) the thread is abandoned:
    it runs on until ``fn`` returns, and what it returns is ignored."""
    host = asyncio.current_task()
    assert host is not None
    st.step_tasks.add(host)
    try:
        # (the future is not kept in a local: it holds the exception the step raised, whose
        # traceback holds this frame, a cycle only the cyclic GC would free)
        return await st.host.in_thread(fn, args, kwargs)
    except asyncio.CancelledError:
        if host in st.cancelled_hosts:
            raise _StepCancelled() from None
        raise
    finally:
        st.step_tasks.discard(host)
        if host in st.cancelled_hosts:
            st.cancelled_hosts.discard(host)
            host.uncancel()
        # (this frame is in the traceback of what the step raised, which the task may keep
        # as its outcome: no local may hold the task, a cycle only the cyclic GC would free)
        del host


async def _timed(
    st: ActivationState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    is_async: bool,
    name: str,
    timeout: float,
) -> Any:
    """One attempt of the step, bounded by ``timeout`` seconds of the engine's clock: past
    them its task is cancelled inside the step (an async step is cancelled, a sync one is
    abandoned in its thread) and the attempt fails with ``StepTimeoutError``, also when the
    step swallowed the cancellation and returned."""
    host = asyncio.current_task()
    assert host is not None
    timer = _Timeout(st, host, round(st.host.now() + timeout, 6))
    try:
        try:
            result = await _execute(st, fn, args, kwargs, is_async)
        finally:
            fired = timer.stop()
            del timer
    except asyncio.CancelledError:
        # (a teardown, or a cancellation from elsewhere as well, goes on as it would have)
        if fired and not st.tearing_down and not host.cancelling():
            raise StepTimeoutError(name, timeout) from None
        raise
    finally:
        del host  # (as in ``_execute``: no local holds the task once the step has ended)
    if fired:
        raise StepTimeoutError(name, timeout)
    return result


class _Timeout:
    """The deadline of one attempt: at ``deadline`` (by the host's clock) it cancels the task
    running the step. It is registered with the host as a timer while it runs (an in-process
    deadline: ``TestEnv``'s virtual clock jumps to it as to a durable timer)."""

    __slots__ = ("_st", "_task", "_waiter", "fired")

    def __init__(self, st: ActivationState, task: asyncio.Task[Any], deadline: float) -> None:
        self.fired = False
        self._st = st
        self._task = task
        st.host.add_timer(self, deadline)
        self._waiter: asyncio.Future[None] | None = asyncio.ensure_future(self._wait(deadline))

    async def _wait(self, deadline: float) -> None:
        await self._st.host.sleep_until(deadline)
        if self._waiter is not None:  # (not stopped meanwhile)
            self.fired = True
            self._st.host.drop_timer(self)
            self._task.cancel()

    def stop(self) -> bool:
        """End the timer (once); whether it fired, its cancellation then taken back."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.cancel()
            self._st.host.drop_timer(self)
            if self.fired:
                self._task.uncancel()
        return self.fired


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw
