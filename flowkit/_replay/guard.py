"""What a body may await: only ctx calls, whose outcomes are recorded and replayed (see
docs/writing-workflows.md, "Await only ctx calls").

``Guard`` drives each branch's coroutine and sees what it yields to the event loop; the checks
below run as ctx calls are made, started and left. An await that is not a ctx call, a
cancellation flowkit did not request, a ctx call run in a task of its own and one never awaited
all end the activation ``Diverged`` (the run is blocked) rather than record a history a replay
would not reproduce."""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Generator
from types import CoroutineType
from typing import Any

from .branch import CURRENT, Branch
from .control_flow import _Diverged, _Evicted
from .state import ActivationState

# -- the rules, as the NonDeterminismErrors state them ----------------------------------------
USE_INSTEAD = (
    "a workflow body may only await ctx calls, whose outcomes are recorded and replayed: "
    "use ctx.sleep()/ctx.sleep_until() for a durable pause, "
    "ctx.wait_for_signal(name, timeout=...) to wait for the outside world, "
    "ctx.gather() to run ctx calls concurrently, and put I/O inside a step function, "
    "bounded by ctx.step(fn, ..., timeout=seconds)"
)
FOREIGN_AWAIT = "it is not recorded, so a replay cannot reproduce it; " + USE_INSTEAD
FOREIGN_CANCEL = (
    "a cancellation flowkit did not request (asyncio.timeout, asyncio.wait_for, task.cancel) "
    "is not recorded, so a replay would run the call again and could take another branch; "
    "bound a step with ctx.step(fn, ..., timeout=seconds) (recorded as a StepTimeoutError "
    "its retry policy sees), a wait with ctx.wait_for_signal(name, timeout=...) or a "
    "ctx.sleep() in a ctx.gather"
)
FOREIGN_TASK = (
    "ctx calls must be awaited by the workflow body itself, not in a task of their own "
    "(asyncio.create_task, asyncio.gather, asyncio.shield, asyncio.wait_for): use ctx.gather() "
    "to run them concurrently, and ctx.step(fn, ..., timeout=seconds) to bound a step"
)
UNAWAITED = (
    "every ctx call must be awaited where it is made, before the next one starts (a missing "
    "`await`?): its position is taken when it is called, so a call that never runs leaves a "
    "hole that the fixed code would fill out of order; pass concurrent calls to ctx.gather()"
)


class Guard:
    """Drives one branch's coroutine (the body, or an awaitable given to ``ctx.gather``) and
    sees every value it yields to the event loop. A value yielded while none of the branch's
    ctx calls is executing comes from an await flowkit does not record (``asyncio.sleep``,
    an ``asyncio.Event``, a task...): ``foreign_await`` gives the exception thrown back in
    instead, so the body never waits on it."""

    __slots__ = ("_aw", "_br", "_st")

    def __init__(self, aw: Any, br: Branch, st: ActivationState) -> None:
        self._aw = aw
        self._br = br
        self._st = st

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
                exc = foreign_await(self._st, br, it, y)
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


# -- the checks ---------------------------------------------------------------------------------
def made_on(st: ActivationState) -> Branch:
    """The branch a new ctx call takes its position on: the caller's, which must be
    executing its own coroutine (not a task it started). ``Calls.step`` inlines this."""
    br = st.branch()
    if not br.running:
        raise made_in_foreign_task(st, br)
    return br


def made_in_foreign_task(st: ActivationState, br: Branch) -> _Diverged:
    """A ctx call is made on ``br`` from a task of its own."""
    pos = f"{br.prefix}{br.counter + 1}"
    return st.diverge(pos, None, "a ctx call made in a task of its own", FOREIGN_TASK)


def enter(st: ActivationState, made_in: Branch, idx: int) -> Branch:
    """A ctx call (number ``idx`` of branch ``made_in``) starts executing: the branch
    executing it, whose count of executing calls it raises (see ``Guard``). It must start
    after the calls made before it, in its branch's own task, or else in a child branch of
    the ``ctx.gather`` it was given to. ``steps.run_step`` inlines this."""
    br = made_in
    if br.running:
        if idx != br.next:
            raise unawaited(st, br)
        br.next = idx + 1
    else:
        br = running_branch(st, made_in)
    br.depth += 1
    return br


def running_branch(st: ActivationState, made_in: Branch) -> Branch:
    """The branch executing a ctx call made on ``made_in`` while that one is not running:
    a child of the ``ctx.gather`` it was given to; else the call runs in a task of its
    own, which fails the activation."""
    cur = CURRENT.get()
    if cur is None or cur[0] is not st:
        raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
    br: Branch = cur[1]
    if br is made_in or not br.running:
        pos, call = describe_call(call_frame())
        task = asyncio.current_task()
        if task is not None:  # (nobody awaits this task: its failure is the report's)
            task.add_done_callback(_retrieve)
        raise st.diverge(
            pos, st.recorded(pos), f"{call} awaited in a task of its own", FOREIGN_TASK
        )
    return br


def cancel_left(st: ActivationState, br: Branch) -> None:
    """A ``CancelledError`` leaves a ctx call of branch ``br``: the delivery of the run's
    cancellation, or (the task is being cancelled by someone else: ``asyncio.timeout``,
    ``task.cancel()``) a cancellation flowkit did not request, which fails the
    activation: it is recorded nowhere, so a replay would not reproduce it."""
    if st.tearing_down:
        return
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        pos, call = describe_call(call_frame())
        raise st.diverge(
            pos, st.recorded(pos), f"{call}, cancelled by code outside flowkit", FOREIGN_CANCEL
        )
    br.delivered = True
    br.fresh = True  # (the body's cancellation handler runs now: ``ctx.logger`` logs it)


def foreign_await(st: ActivationState, br: Branch, it: object, yielded: object) -> BaseException:
    """Branch ``br`` yielded to the event loop outside its ctx calls (``Guard``): the
    exception thrown into it there."""
    what = awaited(it, yielded)
    disown(yielded)
    disown_calls(st)
    if st.tearing_down:
        return _Evicted()
    pos = f"{br.prefix}{br.counter + 1}"
    return st.diverge(pos, st.recorded(pos), f"await of {what}, not a ctx call", FOREIGN_AWAIT)


def disown(yielded: object, cancel: bool = False) -> None:
    """A future a body awaited outside its ctx calls, which nobody will await now: its
    outcome is read when it ends, so asyncio does not log "exception was never retrieved"
    beside the activation's own report; with ``cancel`` (a task running a ctx call of the
    activation: ``disown_calls``) it is cancelled too, as the activation ends without it. A
    future of other code (a task the body merely awaited) is left to run."""
    if not isinstance(yielded, asyncio.Future):
        return
    if cancel:
        yielded.cancel()
    yielded.add_done_callback(_retrieve)


def disown_calls(st: ActivationState) -> None:
    """Disown (``disown``) every task running a ctx call of the activation ``st`` (one the
    body wrapped in a task: ``asyncio.wait_for``, ``asyncio.ensure_future``): the
    activation ends without them."""
    for task in asyncio.all_tasks():
        coro: Any = task.get_coro()
        frame = getattr(coro, "cr_frame", None)
        if frame is None or frame.f_code.co_name not in CALL_NAMES:
            continue
        if frame.f_code.co_name != "gather" and frame.f_locals.get("st") is st:
            disown(task, cancel=True)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def unawaited(st: ActivationState, br: Branch) -> _Diverged:
    """The oldest ctx call made on ``br`` and not awaited in its turn (``br.next``)."""
    pos = f"{br.prefix}{br.next}"
    coro: Any = br.head
    disown_calls(st)  # (a call not awaited here may be awaited by a task: it never runs)
    call = "a ctx call"
    if coro is not None and coro.cr_frame is not None:
        at, desc = call_of(coro.cr_code.co_name, coro.cr_frame.f_locals)
        if at == pos:
            call = desc
    return st.diverge(
        pos, st.recorded(pos), f"{call}, never awaited (or awaited too late)", UNAWAITED
    )


def branch_done(st: ActivationState, br: Branch) -> None:
    """Branch ``br``'s coroutine has ended: a ctx call it made and never awaited fails the
    activation (unless it is being torn down); that call is closed unrun."""
    if br.next <= br.counter:
        if not st.tearing_down and st.divergence is None:
            unawaited(st, br)
        head: Any = br.head
        if head is not None and inspect.getcoroutinestate(head) == inspect.CORO_CREATED:
            disown_calls(st)  # (a task the body wrapped it in must not run it closed)
            head.close()  # (Python's "never awaited" warning would only repeat ours)
    br.head = None


# -- what the reports say -----------------------------------------------------------------------
def awaited(it: Any, yielded: Any) -> str:
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
        if type(yielded).__name__ == "_GatheringFuture":
            what = "asyncio.gather(...) (use ctx.gather)"
        elif isinstance(yielded, asyncio.Task):
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


# the code names of the coroutines running ctx calls: ``steps.run_step``, ``waits.run_sleep``,
# ``waits.run_wait_signal``, ``published.run_wait_event``, ``children.run_child``/
# ``run_child_result`` and ``Calls.gather`` (whose local ``g`` is its position)
CALL_NAMES = frozenset(
    {
        "run_step",
        "run_sleep",
        "run_wait_signal",
        "run_child",
        "run_child_result",
        "run_wait_update",
        "run_reply_update",
        "run_wait_event",
        "gather",
    }
)


def call_frame() -> Any:
    """The frame of the ctx call (``run_step``, ``run_sleep``...) the caller is running for."""
    # (sys._getframe is documented CPython API: the caller's frame, cheaper than inspect)
    frame: Any = sys._getframe(1)  # noqa: SLF001
    while frame is not None and frame.f_code.co_name not in CALL_NAMES:
        frame = frame.f_back
    return frame


def describe_call(frame: Any) -> tuple[str, str]:
    """(position, description) of the ctx call running in ``frame`` (``call_frame``)."""
    if frame is None:
        return "?", "a ctx call"
    return call_of(frame.f_code.co_name, frame.f_locals)


def call_of(code_name: str, local: dict[str, Any]) -> tuple[str, str]:
    """(position, description) of a ctx call from the locals of its coroutine's frame."""
    pos = str(local.get("pos", local.get("g", "?")))
    if code_name == "run_step":
        return pos, f"step({local.get('name')!r})"
    if code_name == "run_wait_signal":
        return pos, f"wait_for_signal({local.get('name')!r})"
    if code_name == "run_sleep":
        return pos, "sleep"
    if code_name == "run_wait_update":
        return pos, f"wait_for_update({local.get('name')!r})"
    if code_name == "run_reply_update":
        return pos, f"reply to update {getattr(local.get('upd'), 'name', '?')!r}"
    if code_name == "run_wait_event":
        return pos, f"wait_for_event({local.get('name')!r})"
    if code_name == "run_child":
        call = local.get("call")
        return pos, f"child({getattr(call, 'name', '?')!r})"
    if code_name == "run_child_result":
        return pos, f"child result({local.get('run_id')!r})"
    return pos, code_name
