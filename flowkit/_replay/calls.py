"""The ctx calls of an activation, as ``WorkflowCtx`` makes them (``Calls`` is its
``Runtime``): each call is checked and takes the next position of its branch when it is made,
and returns the coroutine that runs it over the activation's ``ActivationState``: a step
(``steps.py``), a timer or a signal wait (``waits.py``); ``ctx.gather`` runs here, its
awaitables each in a child branch of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import CoroutineType
from typing import TYPE_CHECKING, Any, NoReturn

from .._core import limits as _limits
from .._core import serde as _serde
from .._model.ctx import ChildHandle
from .._model.definition import RetryPolicy, definition_of
from ..events import ChildFailed, ChildStarted, PatchMarker
from . import published, search, updates
from .branch import CURRENT, Branch
from .children import ChildCall, run_child, run_child_result
from .control_flow import _ContinueAsNew
from .guard import Guard, branch_done, cancel_left, made_in_foreign_task, made_on, unawaited
from .matching import ReplayStub
from .patches import PatchCall, check_patch_id, parse_pos
from .state import ActivationState
from .steps import run_step
from .waits import run_sleep, run_wait_signal

if TYPE_CHECKING:
    from pydantic import TypeAdapter


@dataclass
class Group:
    """The children of one ``ctx.gather`` still running, and whether their parent still
    counts as blocked on them."""

    remaining: int
    parent_unblocked: bool = False


class Calls:
    """What ``WorkflowCtx`` calls: the ctx calls over one activation's state ``st``."""

    __slots__ = ("attempt", "run_id", "st", "workflow")

    def __init__(self, st: ActivationState) -> None:
        self.st = st
        self.run_id = st.run_id
        self.workflow = st.defn.name
        self.attempt = st.attempt

    # -- facts -------------------------------------------------------------------------
    @property
    def is_replaying(self) -> bool:
        return self.st.is_replaying

    def log_state(self) -> tuple[bool, str | None, str | None]:
        st = self.st
        cur = CURRENT.get()
        if cur is None or cur[0] is not st:
            return st.is_replaying, None, None
        br = cur[1]
        pos = f"{br.prefix}{br.counter}" if br.counter else (br.prefix.rstrip("/") or None)
        return st.is_replaying or not br.fresh, pos, br.step

    def now(self) -> float:
        return self.st.branch().now_at

    def random(self) -> float:
        return self.st.branch().rng.random()

    def randbits(self, k: int) -> int:
        return self.st.branch().rng.getrandbits(k)

    # -- steps -------------------------------------------------------------------------
    def step(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None,
        retry: RetryPolicy | None,
        timeout: float | timedelta | None = None,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Coroutine[Any, Any, Any]:
        if not callable(fn):
            raise TypeError(f"ctx.step needs a callable, got {fn!r}")
        if compensate is not None and not callable(compensate):
            raise TypeError(f"ctx.step compensate= takes a callable, got {compensate!r}")
        secs = _limits.timeout("ctx.step timeout=", timeout, positive=True, workflow=self.workflow)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError("retry= takes a flowkit.RetryPolicy")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"ctx.step name= takes a str, got {name!r}")
        # (``made_on``, inlined: the hot path)
        st = self.st
        cur = CURRENT.get()
        if cur is None or cur[0] is not st:
            raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
        br: Branch = cur[1]
        if not br.running:
            raise made_in_foreign_task(st, br)
        pos = br.next_pos()
        idx = br.counter
        coro: Coroutine[Any, Any, Any]
        if isinstance(fn, ReplayStub):  # an injected service stubbed out by replay()
            name = name or ReplayStub.ANY_NAME
            coro = run_step(
                st, br, idx, pos, fn, args, kwargs, name, retry, None, True, secs, compensate
            )
            br.step = name
        else:
            try:
                default, adapter, is_async = _serde.step_meta(fn)
            except BaseException:
                if idx == br.next:  # (the call failed as it was made: nothing to await)
                    br.next = idx + 1
                raise
            name = name or default
            br.step = name
            coro = run_step(
                st,
                br,
                idx,
                pos,
                fn,
                args,
                kwargs,
                name,
                retry,
                adapter,
                is_async,
                secs,
                compensate,
            )
        if idx == br.next:
            br.head = coro  # (for the report, should it never be awaited)
        return coro

    # -- durable waits ------------------------------------------------------------------------
    def sleep(self, seconds: float | timedelta) -> Coroutine[Any, Any, None]:
        secs = _limits.duration("ctx.sleep", seconds, workflow=self.workflow)
        st = self.st
        br = made_on(st)
        pos = br.next_pos()
        coro = run_sleep(st, br, br.counter, pos, None, secs)
        if br.counter == br.next:
            br.head = coro
        return coro

    def sleep_until(self, fire_at: float | datetime) -> Coroutine[Any, Any, None]:
        fire_at = _limits.instant("ctx.sleep_until", fire_at, self.workflow)
        st = self.st
        br = made_on(st)
        pos = br.next_pos()
        coro = run_sleep(st, br, br.counter, pos, fire_at, None)
        if br.counter == br.next:
            br.head = coro
        return coro

    def wait_for_signal(
        self, name: str, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]:
        if not isinstance(name, str) or not name:
            raise ValueError("signal name must be a non-empty string")
        secs = _limits.timeout("ctx.wait_for_signal timeout=", timeout, workflow=self.workflow)
        st = self.st
        br = made_on(st)
        pos = br.next_pos()
        coro = run_wait_signal(st, br, br.counter, pos, name, secs)
        if br.counter == br.next:
            br.head = coro
        return coro

    # -- talking to the world (docs/updates.md) ----------------------------------------------
    def set_event(self, key: str, value: Any) -> Awaitable[None]:
        return published.set_event(self.st, key, value)

    def wait_for_event(
        self, name: str, match: dict[str, Any] | None, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]:
        return published.wait_for_event(self.st, name, match, timeout)

    def wait_for_update(
        self, name: str, timeout: float | timedelta | None
    ) -> Coroutine[Any, Any, Any]:
        return updates.wait_for_update(self.st, self, name, timeout)

    def reply_update(self, upd: Any, value: Any) -> Coroutine[Any, Any, None]:
        return updates.reply_update(self.st, upd, value)

    def upsert_search(self, attrs: dict[str, Any]) -> Awaitable[None]:
        return search.upsert_search(self.st, attrs)

    # -- children ----------------------------------------------------------------------
    def child(
        self,
        workflow: Any,
        input: Any,
        run_id: str | None,
        version: str | None,
        tags: tuple[str, ...],
        wait: bool,
    ) -> Coroutine[Any, Any, Any]:
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"a child's run_id must be a non-empty string, got {run_id!r}")
        if version is not None and not isinstance(version, str):
            raise TypeError(f"version must be a string, got {type(version).__name__}")
        st = self.st
        name, adapter = _child_workflow(st, workflow, version)
        br = made_on(st)
        pos = br.next_pos()
        # n counts the child calls (in the order they are made); a recorded call keeps the
        # id its history says, so a replay whose concurrent branches make them in another
        # order finds the same children
        st.child_calls += 1
        rid = run_id or _recorded_child(st, pos) or f"{self.run_id}.child.{st.child_calls}"
        call = ChildCall(workflow, name, input, rid, version, tags)
        handle = None if wait else (lambda r: ChildHandle(self, r, name, workflow))
        coro = run_child(st, br, br.counter, pos, call, adapter, handle)
        if br.counter == br.next:
            br.head = coro
        return coro

    def child_result(self, run_id: str, workflow: Any) -> Coroutine[Any, Any, Any]:
        st = self.st
        name, adapter = _child_workflow(st, workflow, None)
        br = made_on(st)
        pos = br.next_pos()
        coro = run_child_result(st, br, br.counter, pos, run_id, name, adapter)
        if br.counter == br.next:
            br.head = coro
        return coro

    # -- patching ----------------------------------------------------------------------
    def patched(self, patch_id: str) -> bool:
        return self._patch(patch_id, deprecated=False)

    def continue_as_new(self, input: Any) -> NoReturn:
        """End the body: the activation reports ``Continued`` (validated then). It takes no
        position and records nothing itself: the driver commits ``run_continued``."""
        st = self.st
        made_on(st)
        if st.continued is None:  # (the first call's input: a second comes from a catch)
            st.continued = (input,)
        raise _ContinueAsNew()

    def deprecate_patch(self, patch_id: str) -> None:
        self._patch(patch_id, deprecated=True)

    def _patch(self, patch_id: str, *, deprecated: bool) -> bool:
        """Whether the run takes patch ``patch_id`` (``patches.py``): decided once per
        activation; taken live, it records a ``patch_marker`` with the next write (unless
        replay-only). It takes no position."""
        st = self.st
        pid = check_patch_id(patch_id, self.workflow)
        br = made_on(st)
        p = st.patches
        taken = p.decided.get(pid)
        if taken is None:
            if pid in p.markers:
                taken = True
            elif p.past((*(parse_pos(br.prefix[:-1]) if br.prefix else ()), br.counter), st.index):
                taken = False  # the old code ran here: the run keeps its branch
            else:
                taken = True  # new ground: the new code path
                if not st.replay_only:
                    # (with the next write, never one of its own, and not observed: the
                    # branch's clock must not move, as a replay that finds the marker does
                    # not see it move)
                    st.pending.append(PatchMarker(patch_id=pid, at=st.host.now()))
            p.decided[pid] = taken
        p.calls.setdefault(PatchCall(pid, deprecated, taken), None)
        return taken

    # -- concurrency -------------------------------------------------------------------
    async def gather(self, aws: tuple[Awaitable[Any], ...]) -> list[Any]:
        st = self.st
        parent = made_on(st)
        g = parent.next_pos()
        # the parent's calls not started yet must be ctx calls given here: its children run them
        waiting = parent.counter - parent.next
        if waiting and sum(_made_on_branch(aw, parent) for aw in aws) != waiting:
            raise unawaited(st, parent)
        parent.next = parent.counter + 1
        parent.depth += 1
        try:
            return await self._gather(parent, g, aws)
        except asyncio.CancelledError:
            cancel_left(st, parent)
            raise
        finally:
            parent.depth -= 1

    async def _gather(self, parent: Branch, g: str, aws: tuple[Awaitable[Any], ...]) -> list[Any]:
        st = self.st
        group = Group(remaining=len(aws))
        if not aws:
            return []
        children = [parent.child(g, i) for i in range(len(aws))]
        tasks = []
        st.live += len(aws)
        for child, aw in zip(children, aws, strict=True):
            task = asyncio.ensure_future(self._child(child, aw, group))
            st.children.add(task)
            task.add_done_callback(self._child_ended)
            tasks.append(task)
        st.blocked += 1
        try:
            await asyncio.wait(tasks)
        finally:
            if not group.parent_unblocked:
                group.parent_unblocked = True
                st.blocked -= 1
        for child in children:
            parent.now_at = max(parent.now_at, child.now_at)
        # (the lines after the gather ran before unless one of its children did something new)
        parent.fresh = any(child.fresh for child in children)
        # Read every child's outcome (so none is reported as never retrieved), then raise the
        # first failure by argument order, so a replay raises the same one.
        outcomes = [asyncio.CancelledError() if t.cancelled() else t.exception() for t in tasks]
        for exc in outcomes:
            if exc is not None:
                raise exc
        return [t.result() for t in tasks]

    def _child_ended(self, task: asyncio.Task[Any]) -> None:
        self.st.children.discard(task)
        # (read, so that the outcome of a child whose gather was interrupted, and is nobody's
        # now, is not logged as "never retrieved"; the gather reads it as usual otherwise)
        silence(task)

    async def _child(self, branch: Branch, aw: Awaitable[Any], group: Group) -> Any:
        st = self.st
        CURRENT.set((st, branch))
        try:
            return await Guard(aw, branch, st)
        finally:
            st.live -= 1
            branch_done(st, branch)
            group.remaining -= 1
            if group.remaining == 0 and not group.parent_unblocked:
                group.parent_unblocked = True
                st.blocked -= 1
            st.check_stuck()


def _child_workflow(
    st: ActivationState, workflow: Any, version: str | None
) -> tuple[str, TypeAdapter[Any] | None]:
    """A child call's workflow: its name, and its output's adapter: the class's or
    instance's, or for a name the one its host has registered (``None``: the output is
    returned as stored JSON)."""
    if isinstance(workflow, str):
        if not workflow:
            raise ValueError("a child's workflow name must be a non-empty string")
        known = getattr(st.host, "child_output_adapter", None)
        return workflow, None if known is None else known(workflow, version)
    defn = definition_of(workflow)
    if defn is None:
        raise TypeError(f"{workflow!r} is not a @workflow class, instance or name")
    return defn.name, defn.output_adapter


def _recorded_child(st: ActivationState, pos: str) -> str | None:
    """The child id the history records at ``pos`` (``None``: none)."""
    for ev in st.index.get(pos, ()):
        if isinstance(ev, ChildStarted | ChildFailed):
            return ev.run_id
    return None


def _made_on_branch(aw: object, br: Branch) -> bool:
    """Whether ``aw`` is a ctx call made on branch ``br`` that has not started."""
    if type(aw) is not CoroutineType or aw.cr_code not in _CALL_CODES or aw.cr_frame is None:
        return False
    return aw.cr_frame.f_locals.get("made_in") is br


_CALL_CODES = frozenset(
    {
        run_step.__code__,
        run_sleep.__code__,
        run_wait_signal.__code__,
        run_child.__code__,
        run_child_result.__code__,
        updates.run_wait_update.__code__,
        updates.run_reply_update.__code__,
        published.run_wait_event.__code__,
    }
)


def silence(task: asyncio.Task[Any]) -> None:
    """Read a finished task's outcome, so that asyncio does not log it as never retrieved."""
    if task.done() and not task.cancelled():
        task.exception()
