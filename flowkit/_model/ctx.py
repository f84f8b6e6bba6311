"""``WorkflowCtx``: the author-facing API. It reaches the engine only through ``Runtime``."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, Protocol, TypeVar, overload

from ..logging import WorkflowLogger, logger_name
from .definition import RetryPolicy

T = TypeVar("T")


class Runtime(Protocol):
    """What a ``WorkflowCtx`` needs from whoever executes the body (the replay activation)."""

    run_id: str
    workflow: str
    attempt: int

    @property
    def is_replaying(self) -> bool: ...

    def log_state(self) -> tuple[bool, str | None, str | None]:
        """For ``ctx.logger``: whether the calling line ran in an earlier activation (the body
        replays it), the branch's last position and the name of its last step (``None``
        outside the body)."""
        ...

    def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Coroutine[Any, Any, Any]: ...

    def sleep_until(self, fire_at: float | datetime) -> Coroutine[Any, Any, None]: ...

    def sleep(self, seconds: float | timedelta) -> Coroutine[Any, Any, None]: ...

    def wait_for_signal(
        self, name: str, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]: ...

    async def gather(self, aws: tuple[Awaitable[Any], ...]) -> list[Any]: ...

    def patched(self, patch_id: str) -> bool: ...

    def child(
        self,
        workflow: Any,
        input: Any,
        run_id: str | None,
        version: str | None,
        tags: tuple[str, ...],
        wait: bool,
    ) -> Coroutine[Any, Any, Any]: ...

    def child_result(self, run_id: str, workflow: Any) -> Coroutine[Any, Any, Any]: ...

    def deprecate_patch(self, patch_id: str) -> None: ...

    def now(self) -> float: ...

    def random(self) -> float: ...

    def randbits(self, k: int) -> int: ...

    def continue_as_new(self, input: Any) -> NoReturn: ...

    def set_event(self, key: str, value: Any) -> Awaitable[None]: ...

    def wait_for_event(
        self, name: str, match: dict[str, Any] | None, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]: ...

    def wait_for_update(
        self, name: str, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]: ...

    def upsert_search(self, attrs: dict[str, Any]) -> Awaitable[None]: ...


class ChildHandle:
    """A child run started by ``ctx.start_child``: its id, and ``await handle.result()`` for
    its output (``ChildWorkflowError`` when it failed, was cancelled or died). ``result()``
    takes a position of the branch that calls it, like any ctx call, so it replays in place;
    pass it to ``ctx.gather`` to await several children at once."""

    __slots__ = ("_rt", "_wf", "run_id", "workflow")

    def __init__(self, runtime: Runtime, run_id: str, workflow: str, wf: Any) -> None:
        self._rt = runtime
        self._wf = wf
        self.run_id = run_id
        self.workflow = workflow

    def result(self) -> Coroutine[Any, Any, Any]:
        """Await the child's outcome: its output, validated with its workflow's output type."""
        return self._rt.child_result(self.run_id, self._wf)

    def __repr__(self) -> str:
        return f"ChildHandle(run_id={self.run_id!r}, workflow={self.workflow!r})"


class UpdateRequest:
    """An update a run took with ``ctx.wait_for_update``: its ``name``, ``update_id`` and
    ``arg`` (validated against the workflow's ``updates`` type); ``await upd.reply(value)``
    records the answer ``engine.update`` returns. ``reply`` takes a position of the branch
    that calls it, like any ctx call."""

    __slots__ = ("_rt", "arg", "name", "pos", "replied", "update_id")

    def __init__(self, runtime: Any, name: str, update_id: str, arg: Any, pos: str) -> None:
        self._rt = runtime
        self.name = name
        self.update_id = update_id
        self.arg = arg
        self.pos = pos
        self.replied = False  # (set by the first ``reply`` call)

    def reply(self, value: Any = None) -> Coroutine[Any, Any, None]:
        """Answer the update: ``engine.update`` returns ``value`` to its caller. An update
        takes one reply: a second ``reply`` raises ``RuntimeError`` (nothing recorded)."""
        result: Coroutine[Any, Any, None] = self._rt.reply_update(self, value)
        return result

    def __repr__(self) -> str:
        return f"UpdateRequest(name={self.name!r}, update_id={self.update_id!r})"


class WorkflowCtx:
    """The handle a workflow body gets: every durable effect goes through it.

    Each call takes the next position of the body; on replay a call that already has an event
    returns the recorded outcome instead of running again."""

    __slots__ = ("_logger", "_rt")

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._logger: WorkflowLogger | None = None

    @overload
    def step(
        self,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[T], Any] | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...

    @overload
    def step(
        self,
        fn: Callable[..., T],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[T], Any] | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, T]: ...

    def step(
        self,
        fn: Callable[..., Any],
        *args: Any,
        name: str | None = None,
        retry: RetryPolicy | None = None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> Coroutine[Any, Any, Any]:
        """Run ``fn(*args, **kwargs)`` (sync or async) once and memoize its outcome.

        The position is taken when ``step`` is called, so ``ctx.gather(ctx.step(a),
        ctx.step(b))`` replays in argument order. ``retry`` retries with durable backoff; a
        final failure raises ``StepFailedError``. ``timeout`` (seconds > 0
        or a ``timedelta``, per attempt, on the engine's clock; ``None`` or ``math.inf``:
        none) fails an attempt that runs longer with ``StepTimeoutError``: an async ``fn`` is
        cancelled, a sync one (it runs in a step thread, never on the event
        loop) is abandoned there and keeps running until it returns.

        ``compensate`` (a saga's undo, sync or async) is registered once the step completes:
        should the body later fail, or ``engine.cancel(run_id, compensate=True)`` cancel the
        run, the registered undos run in reverse order, each ``compensate(result)`` as a
        durable step with this step's ``retry`` and ``timeout``. The registrations are
        rebuilt as the body replays, so the code must pass ``compensate=`` again on every
        execution (docs/composing-workflows.md, "Compensation (sagas)")."""
        return self._rt.step(fn, args, kwargs, name, retry, timeout, compensate)

    def sleep(self, seconds: float | timedelta) -> Coroutine[Any, Any, None]:
        """A durable timer: the run suspends and a worker resumes it when due. ``seconds``
        (or a ``timedelta``) is finite, >= 0 and at most ``flowkit.stores.limits.MAX_DURATION``
        (1,000 years); anything else, ``math.inf`` included, raises ``InvalidInputError`` at
        the call and records nothing (docs/writing-workflows.md, "Durations and their
        limits")."""
        return self._rt.sleep(seconds)

    def sleep_until(self, when: float | datetime) -> Coroutine[Any, Any, None]:
        """Sleep until an instant (epoch seconds or an aware ``datetime``) no later than
        9999-12-31T23:59:59Z (``InvalidInputError`` at the call otherwise)."""
        return self._rt.sleep_until(when)

    def wait_for_signal(
        self, name: str, timeout: float | timedelta | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Wait for ``engine.signal(run_id, name, payload)`` and return the payload.

        Signals sent before the wait are buffered. With ``timeout`` (seconds or a
        ``timedelta``; ``None`` or ``math.inf``: none) it raises ``SignalTimeout`` when none
        arrives in time."""
        return self._rt.wait_for_signal(name, timeout)

    async def gather(self, *aws: Awaitable[Any]) -> list[Any]:
        """Await several steps/sleeps/branches concurrently with deterministic replay.

        All of them run to the end; the exception of the first failed one (by argument order)
        is raised, so a replay raises the same one."""
        return await self._rt.gather(aws)

    def child(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        version: str | None = None,
        tags: Sequence[str] = (),
    ) -> Coroutine[Any, Any, Any]:
        """Start a child run of ``workflow`` (a name, class or registered instance) with
        ``input`` and return its output (``ChildWorkflowError`` when it fails, is cancelled,
        dies, or cannot start). Its id is ``run_id``, by default ``f"{parent}.child.{n}"``
        (``n`` counts this run's child calls from 1); the start is idempotent by that id, so
        a crash never starts two. The parent suspends while the child runs and is woken as
        soon as it settles. Cancelling the parent cancels the child."""
        return self._rt.child(workflow, input, run_id, version, _tags(tags), True)

    def start_child(
        self,
        workflow: Any,
        input: Any = None,
        *,
        run_id: str | None = None,
        version: str | None = None,
        tags: Sequence[str] = (),
    ) -> Coroutine[Any, Any, ChildHandle]:
        """Start a child run like ``child`` without waiting for it: a ``ChildHandle``
        (``handle.run_id``, ``await handle.result()``). A child that cannot start raises
        ``ChildWorkflowError`` here."""
        return self._rt.child(workflow, input, run_id, version, _tags(tags), False)

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new code path of patch ``patch_id`` (a deploy that
        changes the body in place while runs of the old code are in flight).

        True for a run that reaches this point on the new code (it records a ``patch_marker``)
        and for one whose history has that marker; False for a run the old code had already
        taken past this point, so it keeps the old branch. Decided once per activation; it
        takes no position, so the calls around it keep theirs. ``patch_id`` is a non-empty
        string (``InvalidInputError`` otherwise)."""
        return self._rt.patched(patch_id)

    def deprecate_patch(self, patch_id: str) -> None:
        """The cleanup deploy of patch ``patch_id``: the ``if ctx.patched(...)`` is gone and
        only the new branch is left. It accepts histories with or without the marker, and
        records the marker where ``patched`` would have (so that workers still running the
        ``patched`` code replay runs this code started). Deploy it once no run that took the
        old branch is in flight; remove the call in a later deploy."""
        self._rt.deprecate_patch(patch_id)

    def now(self) -> datetime:
        """Deterministic current time: the same value on every replay."""
        return datetime.fromtimestamp(self._rt.now(), tz=UTC)

    def random(self) -> float:
        """A deterministic float in [0, 1)."""
        return self._rt.random()

    def uuid4(self) -> uuid.UUID:
        """A deterministic version-4 UUID."""
        return uuid.UUID(int=self._rt.randbits(128), version=4)

    def continue_as_new(self, input: Any) -> NoReturn:
        """End this run and start its successor ``f"{base}~{n}"`` (same workflow and version)
        with ``input`` and a fresh history, in one transaction (docs/composing-workflows.md). It
        never returns: it raises an internal control-flow exception (a ``BaseException``) that the
        body must let through; a body that catches it and goes on fails its run. A pending cancel
        wins (the run settles ``cancelled``, no successor); an ``input`` that does not validate
        fails the run. See docs/composing-workflows.md, "Continue-as-new"."""
        self._rt.continue_as_new(input)

    # -- talking to the world (docs/updates.md) ----------------------------------------------
    def set_event(self, key: str, value: Any) -> Awaitable[None]:
        """Publish ``value`` under ``key`` for ``engine.get_event(run_id, key)`` readers (the
        latest value wins). The call takes its position and records at once when awaited
        (``await ctx.set_event(...)``); not awaited, it is written with the run's next write."""
        return self._rt.set_event(key, value)

    def wait_for_event(
        self,
        name: str,
        *,
        match: dict[str, Any] | None = None,
        timeout: float | timedelta | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Wait for ``engine.publish_event(name, payload)`` whose payload's top-level keys equal
        ``match``'s, and return the payload. An event published while no run waited for it is
        buffered for the first later matching waiter. ``timeout`` (seconds) raises
        ``SignalTimeout``."""
        return self._rt.wait_for_event(name, match, timeout)

    def wait_for_update(
        self, name: str, timeout: float | timedelta | None = None
    ) -> Coroutine[Any, Any, UpdateRequest]:
        """Wait for ``engine.update(run_id, name, arg)``: an ``UpdateRequest`` whose
        ``await upd.reply(value)`` answers the caller. ``timeout`` raises ``SignalTimeout``."""
        return self._rt.wait_for_update(name, timeout)

    def upsert_search(self, **attrs: str | int | float | bool) -> Awaitable[None]:
        """Set search attributes of this run (merged into those it has; ``engine.list_runs
        (search=...)`` finds runs by them). Awaited, it records at once; not awaited, it is
        written with the run's next write."""
        return self._rt.upsert_search(attrs)

    @property
    def run_id(self) -> str:
        return self._rt.run_id

    @property
    def workflow(self) -> str:
        return self._rt.workflow

    @property
    def attempt(self) -> int:
        """1 for the first execution of the run, +1 after each ``engine.retry``."""
        return self._rt.attempt

    @property
    def is_replaying(self) -> bool:
        """True while the body re-executes calls the history already answers, and throughout
        a ``flowkit.replay`` of a history."""
        return self._rt.is_replaying

    @property
    def logger(self) -> WorkflowLogger:
        """A replay-safe ``logging`` logger (``flowkit.logging.WorkflowLogger`` over the stdlib
        logger ``"flowkit.workflow.<name>"``): silent while the body replays, so each line is
        logged once, by the activation that runs it live; its records carry the run id,
        workflow, step, position and attempt (``flowkit_run_id``, ...). See
        docs/writing-workflows.md, "Logging from a workflow"."""
        if self._logger is None:
            rt = self._rt
            self._logger = WorkflowLogger(logging.getLogger(logger_name(rt.workflow)), rt)
        return self._logger


def _tags(tags: Sequence[str]) -> tuple[str, ...]:
    if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
        raise TypeError("tags must be a sequence of strings")
    return tuple(tags)
