"""Deterministic execution of a workflow body over its history (one *activation*).

The body re-executes from the top; each ctx call takes the next position of its branch (see
``branch.py``). A call whose position has recorded events returns/raises the recorded outcome;
a new call runs and records (``calls.py``). When every live branch waits on a durable wait
that this activation cannot satisfy (a timer not yet due, a signal not yet sent, a retry
backoff) the activation is *stuck*: it tears the body down and reports ``Suspended`` with the
earliest wake time.

Each branch runs under a ``Guard`` (``guard.py``): an await that is not a ctx call, a
cancellation flowkit did not request and a ctx call never awaited all end the activation with
``Diverged`` (the run is blocked) rather than record a history a replay would not reproduce.
A requested cancellation is delivered to each branch once, at its first await the history
does not answer (see ``ActivationState.request_cancel``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from .._core import serde as _serde
from .._core.ready_queue import start_next
from .._model.ctx import WorkflowCtx
from .._model.definition import WorkflowDefinition
from ..errors import InvalidInputError, NonDeterminismError, SerializationError
from ..events import ErrorInfo, Event
from . import compensation
from .branch import CURRENT, Branch, seed
from .calls import Calls, silence
from .control_flow import _ContinueAsNew, _ControlFlow, _Diverged, _Evicted
from .guard import Guard, branch_done
from .matching import describe
from .outcome import (
    Cancelled,
    Completed,
    Continued,
    Diverged,
    Evicted,
    Failed,
    Outcome,
    Suspended,
    error_info,
)
from .state import ActivationState, Host, Park, with_note


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
        unwritten: Sequence[Event] = (),
        resumed: bool = False,
    ) -> None:
        self.defn = defn
        self.instance = instance
        self.input_value = input_value
        self.st = ActivationState(
            defn,
            run_id,
            events,
            host,
            cancel_requested=cancel_requested,
            attempt=attempt,
            replay_only=replay_only,
            unwritten=unwritten,
        )
        self.calls = Calls(self.st)
        # an earlier activation ran the body and parked on waits that recorded nothing (the
        # run waits for signals): the lines before its first call are not new (``ctx.logger``)
        self.resumed = resumed
        self._stuck_parks: list[Park] = []

    # -- what the driver reads and tells -------------------------------------------------
    @property
    def pending(self) -> list[Event]:
        """The events not written yet: the driver commits them with the outcome."""
        return self.st.pending

    @property
    def store_error(self) -> Exception | None:
        """The store failure that evicted the activation, if one did."""
        return self.st.store_error

    @property
    def replay_stopped_at(self) -> str | None:
        """Replay-only: the call where the history ran out (``None``: it did not)."""
        return self.st.replay_stopped_at

    def patch_note(self) -> str:
        """What the patches have to do with a divergence found after the activation ("")."""
        return self.st.patches.note()

    def request_cancel(self) -> None:
        """The run's cancellation was requested (``ActivationState.request_cancel``)."""
        self.st.request_cancel()

    def drain(self) -> None:
        """Start no new step: stop at the next durable point (``ActivationState.stop_draining``).
        Steps running now go on to their end."""
        self.st.draining = True

    def evict(self) -> None:
        """Stop at once without recording anything more (``ActivationState.evict``)."""
        self.st.evict()

    # -- the activation ----------------------------------------------------------------
    async def _body(self) -> Any:
        st = self.st
        root = Branch(prefix="", now_at=st.start_at, seed=seed(st.run_id), fresh=not self.resumed)
        CURRENT.set((st, root))
        try:
            body = self.instance.run(WorkflowCtx(self.calls), self.input_value)
            try:
                return await Guard(body, root, st)
            except BaseException as exc:
                run_them = compensation.wanted(st, exc)
                if run_them is None:  # (cancelled while it ran: was it asked for them?)
                    run_them = await st.host.cancel_compensates()
                if run_them:
                    await compensation.compensate(st, failed=isinstance(exc, Exception))
                raise
        finally:
            st.live -= 1
            branch_done(st, root)
            st.mark_done()

    async def run(self) -> Outcome:
        """Execute the body until it settles or gets stuck; never raises for body errors."""
        st = self.st
        st.live = 1
        loop = asyncio.get_running_loop()
        done = st.done_fut = loop.create_future()
        # (started next: the body continues the activation, e.g. of a run just handed over,
        # ahead of the other runs' ready work)
        body = st.body_task = start_next(self._body())
        body.add_done_callback(self._body_ended)
        try:
            if not st.is_done:
                await done
        except asyncio.CancelledError:
            st.evict()  # our worker is going away: so does the body
            raise
        self._stuck_parks = list(st.parks)
        if not body.done() or st.live > 0:  # (a gather's children may outlive the body)
            await self._teardown(body)
        try:
            return self._outcome(body)
        finally:
            # the body's task holds this activation (in its context), and a park's future the
            # exception whose traceback holds the body's frames: let go of both, so that
            # refcounting frees all of it when the run is done, not the cyclic GC, whose
            # pauses hold up every run of the process
            st.body_task = None
            self._stuck_parks = []

    def _body_ended(self, body: asyncio.Task[Any]) -> None:
        self.st.mark_done()
        # (read now: ``_outcome`` reads it again; an activation that never gets there, evicted
        # or cancelled with its process, leaves an outcome that is nobody's, not to be logged
        # as "never retrieved")
        silence(body)

    async def _teardown(self, body: asyncio.Task[Any]) -> None:
        st = self.st
        st.tearing_down = True
        for park in list(st.parks):
            if not park.fut.done():
                park.fut.set_exception(_Evicted())
        for t in list(st.step_tasks):
            t.cancel()
        if not body.done() or st.children:
            # Give the body (and the children of a gather it left) its chance to unwind
            # through their parked awaits.
            for _ in range(100):
                await asyncio.sleep(0)
                if body.done() and not st.children:
                    break
            else:
                rest = {body, *st.children}
                for t in rest:
                    t.cancel()
                await asyncio.wait(rest)

    def _unconsumed(self) -> Diverged | None:
        """The body ended (returned, continued as new) before reaching recorded events."""
        st = self.st
        unconsumed = sorted(set(st.index) - st.consumed)
        if not unconsumed:
            return None
        pos = unconsumed[0]
        return Diverged(
            NonDeterminismError(
                pos,
                describe(st.index[pos][0]),
                None,
                with_note("the body returned before reaching it", st.patches.note()),
            )
        )

    def _continued(self, exc: BaseException | None) -> Outcome:
        """The outcome of a body that called ``ctx.continue_as_new``: ``Continued`` with the
        input validated as ``Engine.start`` validates a new run's; a failure when the input
        does not fit or the body caught the call's exception and went on."""
        st = self.st
        if not isinstance(exc, _ContinueAsNew):
            return Failed(
                ErrorInfo(
                    type="ContinueAsNewError",
                    message="ctx.continue_as_new() must end the body, but its exception was "
                    "caught and the body went on (do not catch BaseException around it)",
                )
            )
        left = self._unconsumed()
        if left is not None:
            return left
        assert st.continued is not None
        defn = self.defn
        try:
            value = defn.input_adapter.validate_python(st.continued[0])
            data = _serde.to_json(value, defn.input_adapter, "workflow input", st.max_payload_bytes)
        except (ValidationError, SerializationError) as err:
            bad = InvalidInputError(defn.name, f"ctx.continue_as_new(): {err}")
            return Failed(error_info(bad))
        return Continued(data)

    def _outcome(self, body: asyncio.Task[Any]) -> Outcome:
        st = self.st
        if st.evicted:
            silence(body)
            return Evicted()
        if st.divergence is not None:
            silence(body)
            return Diverged(st.divergence)
        if st.tearing_down:
            silence(body)
            wakes = [p.deadline for p in self._stuck_parks if p.deadline is not None]
            firm = [p.deadline for p in self._stuck_parks if p.deadline is not None and not p.poll]
            sigs = tuple(sorted({p.signal for p in self._stuck_parks if p.signal}))
            return Suspended(
                min(wakes) if wakes else None,
                sigs,
                st.compensating,
                min(firm) if firm else None,
            )
        left = compensation.unconsumed(st)
        if body.cancelled():
            if left is not None:
                return self._left(left)
            if st.cancel_requested:
                return Cancelled()
            return Failed(ErrorInfo(type="CancelledError", message="body was cancelled"))
        exc = body.exception()
        if exc is not None:
            if isinstance(exc, _Diverged):
                return Diverged(exc.args[0])
            if isinstance(exc, asyncio.CancelledError) and st.cancel_requested:
                if left is not None:
                    return self._left(left)
                return Cancelled()
        if st.continued is not None:
            return self._continued(exc)
        if exc is not None:
            if isinstance(exc, _ControlFlow):
                return Evicted()
            if left is not None:
                return self._left(left)
            return Failed(compensation.with_notes(error_info(exc), st.compensation_notes))
        if left is not None:
            return self._left(left)
        unconsumed = self._unconsumed()
        if unconsumed is not None:
            return unconsumed
        try:
            data = _serde.to_json(
                body.result(),
                self.defn.output_adapter,
                what="workflow output",
                max_bytes=self.st.max_payload_bytes,
            )
        except SerializationError as err:
            return Failed(error_info(err))
        return Completed(data)

    def _left(self, pos: str) -> Diverged:
        """The history holds a compensation at ``pos`` this execution did not run."""
        st = self.st
        return Diverged(
            NonDeterminismError(
                pos,
                describe(st.compensations[pos][0]),
                None,
                with_note(
                    "the body registered no compensation for it (compensate= removed, or the"
                    " body took another path)",
                    st.patches.note(),
                ),
            )
        )
