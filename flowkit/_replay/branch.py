"""The pieces an activation is made of: control-flow signals, outcomes, branches, helpers."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import inspect
import random
import sys
from collections.abc import Awaitable, Coroutine, Generator, Sequence
from dataclasses import dataclass
from types import CoroutineType
from typing import Any, Protocol

from ._history import (
    ErrorInfo,
    Event,
)
from .errors import (
    NonDeterminismError,
    StepFailedError,
)
from .stores.base import InboxSignal


class _ControlFlow(BaseException):
    """Base of internal control-flow signals; a user's ``except Exception`` cannot swallow them."""


class _Evicted(_ControlFlow):
    """The activation is being torn down (suspension, lease lost, replay end)."""


class _Diverged(_ControlFlow):
    """The body diverged from its history; carries the ``NonDeterminismError``."""


class _StepCancelled(BaseException):
    """``_execute`` to ``_step``: the step let out the ``CancelledError`` that
    ``request_cancel`` sent it (not one of its own, nor a cancellation from elsewhere)."""


# -- what a body may await (DESIGN §9): the messages of the NonDeterminismErrors -------------
_USE_INSTEAD = (
    "a workflow body may only await ctx calls, whose outcomes are recorded and replayed: "
    "use ctx.sleep()/ctx.sleep_until() for a durable pause, "
    "ctx.wait_for_signal(name, timeout=...) to wait for the outside world, "
    "ctx.gather() to run ctx calls concurrently, and put I/O and its timeouts inside a "
    "step function"
)
_FOREIGN_AWAIT = "it is not recorded, so a replay cannot reproduce it; " + _USE_INSTEAD
_FOREIGN_CANCEL = (
    "a cancellation flowkit did not request (asyncio.timeout, asyncio.wait_for, task.cancel) "
    "is not recorded, so a replay would run the call again and could take another branch; "
    "bound a wait with ctx.wait_for_signal(name, timeout=...) or a ctx.sleep() in a "
    "ctx.gather, and put a step's timeout inside the step function (e.g. asyncio.timeout "
    "inside an async step)"
)
_FOREIGN_TASK = (
    "ctx calls must be awaited by the workflow body itself, not in a task of their own "
    "(asyncio.create_task, asyncio.gather, asyncio.shield, asyncio.wait_for): use ctx.gather() "
    "to run them concurrently"
)
_UNAWAITED = (
    "every ctx call must be awaited where it is made, before the next one starts (a missing "
    "`await`?): its position is taken when it is called, so a call that never runs leaves a "
    "hole that the fixed code would fill out of order; pass concurrent calls to ctx.gather()"
)


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


@dataclass(slots=True)
class _Branch:
    """A line of execution of the body with its own positions: the body itself, or one
    awaitable of a ``ctx.gather``."""

    prefix: str
    now_at: float
    seed: int
    counter: int = 0
    _rng: random.Random | None = None
    # the branch's coroutine is executing (its ``_Guard`` is inside ``send``): a ctx call
    # made or started while it is not comes from another task
    running: bool = False
    # ctx calls of the branch executing right now: what it yields meanwhile is theirs
    depth: int = 0
    # the branch has seen the run's cancellation (a CancelledError out of one of its ctx
    # calls): from then on its new steps run (cleanup); a gather's children inherit it
    delivered: bool = False
    # the number of the branch's oldest ctx call not yet started (calls start in the order
    # they are made: see ``Activation._enter``), and that call's coroutine
    next: int = 1
    head: Coroutine[Any, Any, Any] | None = None

    @property
    def rng(self) -> random.Random:
        """The branch's deterministic RNG, seeded on first use (most bodies never draw)."""
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

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


class _Guard:
    """Drives one branch's coroutine (the body, or an awaitable given to ``ctx.gather``) and
    sees every value it yields to the event loop. A value yielded while none of the branch's
    ctx calls is executing comes from an await flowkit does not record (``asyncio.sleep``,
    an ``asyncio.Event``, a task...): ``on_foreign`` gives the exception thrown back in
    instead, so the body never waits on it."""

    __slots__ = ("_aw", "_br", "_on_foreign")

    def __init__(self, aw: Any, br: _Branch, on_foreign: Any) -> None:
        self._aw = aw
        self._br = br
        self._on_foreign = on_foreign

    def __await__(self) -> Generator[Any, Any, Any]:
        aw = self._aw
        it: Any
        if type(aw) is CoroutineType or inspect.isgenerator(aw):
            it = aw
        elif hasattr(type(aw), "__await__"):
            it = aw.__await__()
        else:
            raise TypeError(f"ctx.gather takes awaitables, got {aw!r}")
        br = self._br
        value: Any = None
        exc: BaseException | None = None
        # (no local keeps an exception or a yielded future once it has moved on: a traceback
        # holds this frame, and the cycle would leave the activation to the cyclic GC)
        while True:
            br.running = True
            try:
                if exc is None:
                    y = it.send(value)
                else:
                    try:
                        y = it.throw(exc)
                    finally:
                        exc = None
            except StopIteration as stop:
                return stop.value
            finally:
                br.running = False
            value = None
            if not br.depth:
                exc = self._on_foreign(br, it, y)
                y = None
                continue
            try:
                value = yield y
            except GeneratorExit:
                it.close()
                raise
            except BaseException as thrown:  # a cancellation, a teardown: passed on
                exc = thrown
            finally:
                y = None


def _awaited(it: Any, yielded: Any) -> str:
    """What a branch's coroutine ``it`` awaits and where: the last line of the branch's own
    module in the await chain, and what that line awaits."""

    def frame_of(node: Any) -> Any:
        return getattr(node, "cr_frame", None) or getattr(node, "gi_frame", None)

    chain: list[Any] = []
    node = it
    while node is not None and len(chain) < 64:
        chain.append(node)
        node = getattr(node, "cr_await", None) or getattr(node, "gi_yieldfrom", None)
    home = frame_of(it)
    module = home.f_globals.get("__name__") if home is not None else None
    user: tuple[Any, Any] | None = None
    what: str | None = None
    for c in chain:
        frame = frame_of(c)
        if frame is not None and frame.f_globals.get("__name__") == module:
            user = (frame, c)
            continue
        if frame is not None:
            name = getattr(c, "__qualname__", type(c).__name__)
            what = f"{frame.f_globals.get('__name__', '?')}.{name}()"
        break
    if what is None:
        if isinstance(yielded, asyncio.Task):
            what = f"task {yielded.get_name()!r}"
        elif isinstance(yielded, asyncio.Future):
            what = f"a {type(yielded).__name__} ({type(yielded).__module__})"
        elif yielded is None:
            what = "a bare yield to the event loop (asyncio.sleep(0))"
        else:
            what = repr(yielded)[:80]
    if user is None:
        return what
    frame, c = user
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return f"{what} at {where} in {getattr(c, '__qualname__', '?')}"


_CALL_NAMES = frozenset({"_step", "_sleep", "_wait_signal", "gather"})


def _call_frame() -> Any:
    """The frame of the ctx call (``_step``, ``_sleep``...) the caller is running for."""
    frame: Any = sys._getframe(1)
    while frame is not None and frame.f_code.co_name not in _CALL_NAMES:
        frame = frame.f_back
    return frame


def _describe_call(frame: Any) -> tuple[str, str]:
    """(position, description) of the ctx call running in ``frame`` (``_call_frame``)."""
    if frame is None:
        return "?", "a ctx call"
    return _call_of(frame.f_code.co_name, frame.f_locals)


def _call_of(code_name: str, local: dict[str, Any]) -> tuple[str, str]:
    """(position, description) of a ctx call from the locals of its coroutine's frame."""
    pos = str(local.get("pos", local.get("g", "?")))
    if code_name == "_step":
        return pos, f"step({local.get('name')!r})"
    if code_name == "_wait_signal":
        return pos, f"wait_for_signal({local.get('name')!r})"
    if code_name == "_sleep":
        return pos, "sleep"
    return pos, code_name.lstrip("_")


_BRANCH: contextvars.ContextVar[tuple[Any, _Branch] | None] = contextvars.ContextVar(
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


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


def _silence(task: asyncio.Task[Any]) -> None:
    if task.done() and not task.cancelled():
        task.exception()
