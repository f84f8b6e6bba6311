"""``ActivationState``: what one activation knows, shared by its ctx calls (``calls.py``, the
checks of ``guard.py``) and its driver (``activation.py``): the recorded events by position and
which the body has consumed, the events not written yet, the durable waits parked, the steps
running, and how the activation is ending (cancellation, teardown, eviction, divergence)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._core import limits as _limits
from .._core import serde as _serde
from .._core.run import InboxSignal, Run
from .._core.telemetry import ActivationObserver
from .._model.definition import RetryPolicy, WorkflowDefinition
from ..errors import ConflictError, LeaseLostError, NonDeterminismError
from ..events import (
    CancelRequested,
    CompensationCompleted,
    CompensationFailed,
    Event,
    RunRetried,
    RunStarted,
    StepFailed,
)
from .branch import CURRENT, Branch
from .control_flow import _Diverged, _Evicted
from .matching import Call, answers, describe
from .patches import Patches

if TYPE_CHECKING:
    from .._core.event_keys import TakenEvent
    from .children import ChildCall, ChildStart


class Host(Protocol):
    """What an activation needs from the engine: time, durable appends, the signal inbox,
    the step threads."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once the engine's clock reaches ``deadline`` (a step's timeout)."""
        ...

    def add_timer(self, token: object, at: float) -> None:
        """An in-process deadline of the activation (a step's timeout) until ``drop_timer``:
        the engine reports it as a due time (``TestEnv``'s clock jumps to it)."""
        ...

    def drop_timer(self, token: object) -> None: ...

    def step_began(self) -> object:
        """A step attempt starts running its function here: a token for ``step_ended``. The
        engine reports the attempts in flight (``TestEnv`` holds its clock while they run)."""
        ...

    def step_ended(self, token: object) -> None: ...

    def in_thread(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Call a sync step function in one of the engine's step threads."""
        ...

    async def record(
        self,
        events: Sequence[Event],
        consume_signal: int | None = None,
        search: dict[str, Any] | None = None,
    ) -> bool:
        """Append events under the lease (``search``: the run's new search attributes, when
        they change); returns whether cancellation was requested."""
        ...

    async def peek_signal(self, name: str) -> InboxSignal | None: ...

    async def take_event(
        self, pos: str, name: str, match: dict[str, str], *, wait: bool
    ) -> TakenEvent | None:
        """The store's ``take_event`` for the wait at ``pos`` of this run (docs/events.md)."""
        ...

    async def drop_event_wait(self, pos: str, name: str) -> None:
        """The store's ``drop_event_wait`` for the wait at ``pos`` of this run, abandoned (the
        run's cancellation left it): its registration goes, and an event delivered to it
        and not received is offered again (the runs it reaches are woken)."""
        ...

    async def start_child(self, parent_id: str, call: ChildCall) -> ChildStart:
        """Start the child run ``call`` describes (idempotent by its id: an existing child of
        this parent is returned as it is). A ``FlowkitError`` means it cannot start (queue
        full, unknown workflow or version, invalid input, a store without what it needs, a
        singleton parent awaiting a child queued behind itself); any other error is the
        store's."""
        ...

    async def child_run(self, run_id: str) -> Run | None:
        """The child run whose outcome the parent awaits, as its store has it now."""
        ...

    def lease_live(self) -> bool:
        """Whether this worker can still prove it holds the run's lease (by its own clock):
        no step starts and nothing is recorded once it cannot."""
        ...

    async def compensating(self, events: Sequence[Event]) -> None:
        """Append ``events`` under the lease and make the run ``cancelling``: it is about to
        run its compensations after its body failed (``compensation.py``)."""
        ...

    async def cancel_compensates(self) -> bool:
        """Whether the run's latest cancellation request asked for its compensations
        (``engine.cancel(run_id, compensate=True)``): asked when the request reached the
        activation while it ran, so that its history did not hold it yet."""
        ...


@dataclass(slots=True)
class Undo:
    """A saga's compensation registered by the step at ``step_pos`` when it completed:
    ``fn(arg)`` (``arg``: the step's result) with the step's ``retry`` and ``timeout``.
    ``order`` is its completion's: ``(0, seq)`` for a completion the history holds, ``(1, n)``
    for one recorded by this activation (written after all of those, in that order), so that
    the reverse order is the same on every replay."""

    order: tuple[int, int]
    step_pos: str
    fn: Callable[[Any], Any]
    arg: Any
    retry: RetryPolicy | None
    timeout: float | None


@dataclass
class Park:
    """A durable wait of the body (a timer, a signal, a retry backoff) this activation cannot
    end: its future is failed to wake it (cancellation, teardown). ``poll``: its deadline is
    only a fallback look (``CHILD_POLL``), not a time at which anything durable is due."""

    deadline: float | None
    signal: str | None
    fut: asyncio.Future[None]
    poll: bool = False


class ActivationState:
    """The state of one activation of a run's body over its history."""

    def __init__(
        self,
        defn: WorkflowDefinition,
        run_id: str,
        events: Sequence[Event],
        host: Host,
        *,
        cancel_requested: bool,
        attempt: int,
        replay_only: bool,
        unwritten: Sequence[Event],
    ) -> None:
        self.defn = defn  # (also read by ``_serde`` to resolve a step's return annotation)
        self.run_id = run_id
        self.attempt = attempt
        self.host = host
        # the largest payload (a step result, the output) this activation may record: its
        # host's (a worker's ``max_payload_bytes``), else the default
        self.max_payload_bytes: int = getattr(
            host, "max_payload_bytes", _limits.DEFAULT_MAX_PAYLOAD_BYTES
        )
        self.replay_only = replay_only
        # who observes the step attempts that run (``_core/telemetry.py``; a worker's host's)
        self.telemetry: ActivationObserver | None = getattr(host, "telemetry", None)
        self.replay_stopped_at: str | None = None
        self.events = list(events)
        self.index: dict[str, list[Event]] = {}
        self.consumed: set[str] = set()
        self.start_at = 0.0
        # the history says the cancellation was requested (since the last retry): also when
        # the run is no longer ``cancelling`` (it got blocked meanwhile), deliveries it
        # recorded replay as they happened
        cancel_in_history = False
        # the saga (``compensation.py``): the compensations recorded since the last retry by
        # their reserved positions (kept apart from the body's), how many positions earlier
        # attempts took, the undos the body registered, and what the cancellation asked for
        self.compensations: dict[str, list[Event]] = {}
        self.compensated: set[str] = set()
        self.compensation_base = 0
        self.undos: list[Undo] = []
        self.compensating = False
        self.cancel_compensates: bool | None = None
        self.compensation_notes: list[str] = []
        for ev in events:
            if isinstance(ev, RunStarted):
                self.start_at = ev.at
            elif isinstance(ev, RunRetried):
                self._forget_final_failures()
                cancel_in_history = False
                self.cancel_compensates = None
                self.compensation_base += len(self.compensations)
                self.compensations.clear()
            elif isinstance(ev, CancelRequested):
                cancel_in_history = True
                self.cancel_compensates = ev.compensate
            if isinstance(ev, CompensationCompleted | CompensationFailed):
                self.compensations.setdefault(ev.pos, []).append(ev)
                continue
            pos = getattr(ev, "pos", None)
            if pos is not None:
                self.index.setdefault(pos, []).append(ev)
        # branches whose coroutine has not ended, and how many of them wait (parked, or a
        # gather's parent waiting on its children): all waiting on parks is *stuck*
        self.live = 0
        self.blocked = 0
        self.parks: list[Park] = []
        # what runs a step right now: the task of the branch awaiting it (a coroutine step
        # runs inline), or the future of an awaitable step
        self.step_tasks: set[asyncio.Future[Any]] = set()
        # the tasks of the ctx.gather children that have not ended
        self.children: set[asyncio.Task[Any]] = set()
        # tasks request_cancel cancelled inside a step: the step's end takes that request
        # back (Task.uncancel), as the body only sees the step's CancelledError
        self.cancelled_hosts: set[asyncio.Future[Any]] = set()
        self.is_done = False  # the body settled or got stuck (see mark_done)
        # the worker drains (``Worker.drain``): no new step starts; see ``stop_draining``
        self.draining = False
        self.done_fut: asyncio.Future[None] | None = None
        self.cancel_requested = cancel_requested or cancel_in_history
        self.tearing_down = False
        self.evicted = False
        self.divergence: NonDeterminismError | None = None
        self.body_task: asyncio.Task[Any] | None = None
        self.store_error: Exception | None = None
        # Events not yet written: deferred outcomes (see defer) and, first, ``unwritten``
        # bookkeeping the caller hands over (e.g. ``singleton_admitted``, whose fact is
        # already durable on the run row): those ride with the next write but never force one.
        self.pending: list[Event] = list(unwritten)
        self.must_flush = False
        # the history's patch markers and the answers ``ctx.patched`` gave (``patches.py``)
        self.patches = Patches(self.events)
        # ``ctx.continue_as_new``'s input, as the body gave it (the first call's), or None
        self.continued: tuple[Any] | None = None
        # the child calls made so far (``ctx.child``/``start_child``: their default ids)
        self.child_calls = 0

    def _forget_final_failures(self) -> None:
        """After ``run_retried`` a step's failures no longer count: it runs again."""
        for pos, evs in list(self.index.items()):
            if evs and isinstance(evs[-1], StepFailed) and evs[-1].retry_at is None:
                kept: list[Event] = [e for e in evs if not isinstance(e, StepFailed)]
                if kept:
                    self.index[pos] = kept
                else:
                    del self.index[pos]

    # -- facts -------------------------------------------------------------------------
    @property
    def is_replaying(self) -> bool:
        """Some recorded position is not consumed yet (so every line of the body before it ran
        in an earlier activation), or this is a replay of a history (``flowkit.replay``)."""
        return self.replay_only or len(self.consumed) < len(self.index)

    def branch(self) -> Branch:
        """The branch of the body the running task executes."""
        cur = CURRENT.get()
        if cur is None or cur[0] is not self:
            raise RuntimeError("ctx used outside its workflow body (or from a foreign task)")
        return cur[1]

    # -- the history -------------------------------------------------------------------
    def take(
        self,
        pos: str,
        call: Call,
        name: str,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> list[Event]:
        """The recorded events at ``pos``, now consumed; divergence when one of them answers
        another call than ``call`` (of ``name``, with ``args``/``kwargs`` for a step)."""
        evs = self.index.get(pos)
        if not evs:
            return []
        for ev in evs:
            if not answers(ev, call, name):
                raise self.diverge(pos, describe(ev), _describe(call, name, args, kwargs))
        self.consumed.add(pos)
        self._freshen(False)
        return evs

    def _freshen(self, fresh: bool) -> None:
        """The running branch's last call was answered by the history (False) or did something
        new (True): ``Branch.fresh``, what ``ctx.logger`` reads."""
        cur = CURRENT.get()
        if cur is not None and cur[0] is self:
            cur[1].fresh = fresh

    def observe(self, ev: Event) -> None:
        """The running branch has seen ``ev``: its time moves up to the event's."""
        br = self.branch()
        if ev.at > br.now_at:
            br.now_at = ev.at

    def diverge(
        self, pos: str, recorded: str | None, call: str | None, detail: str = ""
    ) -> _Diverged:
        """The body diverged from its history at ``pos``: the activation ends ``Diverged``
        (with the first divergence found); the caller raises what this returns."""
        if self.divergence is None:
            detail = with_note(detail, self.patches.note())
            self.divergence = NonDeterminismError(pos, recorded, call, detail, self._window(pos))
        self.mark_done()
        return _Diverged(self.divergence)

    def _window(self, pos: str, width: int = 2) -> tuple[str, ...]:
        """The recorded events around position ``pos`` (by ``seq``), for the report."""
        evs = self.index.get(pos)
        if evs:
            center = evs[0].seq
        else:  # nothing recorded there: show the end of the history
            center = self.events[-1].seq if self.events else 0
        return tuple(describe(e) for e in self.events if center - width <= e.seq <= center + width)

    def recorded(self, pos: str) -> str | None:
        """The first event recorded at ``pos``, described (``None``: nothing is)."""
        evs = self.index.get(pos)
        return describe(evs[0]) if evs else None

    # -- control -----------------------------------------------------------------------
    def request_cancel(self) -> None:
        """The run's cancellation was requested. It is *delivered* to each branch of the
        body once, as a ``CancelledError`` at its first await the history does not answer:
        at once to the waits parked now and the steps running now, else at the branch's next
        new step (recorded there as a cancelled ``step_failed`` before it starts) or durable
        wait. After its delivery a branch's new steps run (cleanup); durable waits always
        raise ``CancelledError`` once the cancellation was requested."""
        if self.cancel_requested or self.compensating:
            self.cancel_requested = True  # (the compensations run on: it changes nothing)
            return
        self.cancel_requested = True
        for park in list(self.parks):
            if not park.fut.done():
                park.fut.set_exception(asyncio.CancelledError())
        for t in list(self.step_tasks):
            if t.cancel():
                self.cancelled_hosts.add(t)

    def evict(self) -> None:
        """Stop at once without recording anything more (lease lost, engine stopping): the
        body and its running steps are cancelled, as a dying process would lose them."""
        self.evicted = True
        self.tearing_down = True
        self.mark_done()
        for t in list(self.step_tasks):
            t.cancel()
        if self.body_task is not None and not self.replay_only:
            self.body_task.cancel()

    async def stop_draining(self) -> _Evicted:
        """The worker drains and a branch is about to start a step: let the steps already
        running here end, make their records durable, then stop as ``evict`` does. The run
        resumes from this durable point on whichever worker claims it next."""
        if not self.tearing_down:  # (what finished already: durable before any wait)
            await self.flush()
        running = [t for t in self.step_tasks if not t.done()]
        if running:
            # (a step finishing meanwhile writes its record at once while draining: see
            # ``run_step``; a sibling that then parks holds this wait until the grace ends)
            await asyncio.wait(running)
        if not self.tearing_down:
            await self.flush()
        self.evict()
        return _Evicted()

    def stop_replay(self, pos: str, call: str) -> _Evicted:
        """Replay-only mode reached the end of the history: stop without side effects."""
        if self.replay_stopped_at is None:
            self.replay_stopped_at = f"{call} at position {pos}"
        self.evict()
        return _Evicted()

    def mark_done(self) -> None:
        """The body settled, got stuck or diverged: the activation's driver goes on."""
        self.is_done = True
        fut = self.done_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def check_alive(self) -> None:
        if self.tearing_down:
            raise _Evicted()

    def check_lease(self) -> None:
        """Before a side effect (a step function): stop here, writing nothing more, when the
        lease can no longer be proven live (another instance may own the run by now)."""
        if not self.host.lease_live():
            self.evict()
            raise _Evicted()

    def check_stuck(self) -> None:
        """Every live branch waits and some on a park: nothing this activation can do will
        wake them, so it suspends."""
        if self.live > 0 and self.blocked >= self.live and self.parks:
            self.mark_done()

    # -- effects -----------------------------------------------------------------------
    async def record(self, events: Sequence[Event], consume_signal: int | None = None) -> None:
        """Append ``events`` (after the deferred ones) under the lease; ``consume_signal``
        takes that inbox signal with them, or raises ``ConflictError`` (nothing written) when
        a racing activation took it first."""
        self.check_alive()
        if self.replay_only:
            ev = events[0]
            raise self.stop_replay(getattr(ev, "pos", "?"), ev.type)
        # Take the deferred events now: a concurrent branch recording meanwhile must neither
        # write them twice nor lose one it defers while this write is in flight.
        batch, self.pending = self.pending, []
        must_flush, self.must_flush = self.must_flush, False
        try:
            cancel = await self.host.record([*batch, *events], consume_signal)
        except LeaseLostError:
            self.evict()
            raise _Evicted() from None
        except ConflictError:
            if consume_signal is not None:
                self.pending[:0] = batch  # nothing was written: keep them for the next write
                self.must_flush = self.must_flush or must_flush
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
            if not self.tearing_down:
                # Cancelled by code outside flowkit (``guard.cancel_left`` blocks the run): a
                # store call cancelled while it waits has not written, so the deferred events
                # go with the blocked run's commit. (Were it cancelled after its commit, they
                # would be there twice, and replay reads the first.)
                self.pending[:0] = batch
                self.must_flush = self.must_flush or must_flush
            raise
        for ev in events:  # only the caller's: deferred events were observed by their branch
            self.observe(ev)
        if events:
            self._freshen(True)
        if cancel:
            self.request_cancel()

    async def start_compensating(self) -> None:
        """The body failed and its compensations are about to run: the run goes
        ``cancelling`` (with the deferred events) before the first of them. Replay-only: a
        status, nothing to check."""
        self.check_alive()
        if self.replay_only:
            return
        batch, self.pending = self.pending, []
        self.must_flush = False
        try:
            await self.host.compensating(batch)
        except (LeaseLostError, ConflictError):
            self.evict()
            raise _Evicted() from None
        except Exception as exc:
            self.store_error = exc
            self.evict()
            raise _Evicted() from exc

    def defer(self, event: Event) -> None:
        """Record ``event`` with the next write instead of a write of its own: it is flushed
        before any further side effect (the next step function) and otherwise travels in the
        activation's final commit. A crash before the flush re-runs just that step."""
        self.pending.append(event)
        self.must_flush = True
        self.observe(event)
        self._freshen(True)

    async def flush(self) -> None:
        """Write the deferred events now (before a side effect that must follow them)."""
        if self.must_flush:
            await self.record([])

    async def park(
        self, deadline: float | None, signal: str | None = None, *, poll: bool = False
    ) -> None:
        """Wait durably. Never returns within this activation: it raises ``CancelledError``
        on cancellation, or ``_Evicted`` when the activation suspends. ``poll``: the deadline
        is only a fallback look (``Park.poll``)."""
        self.check_alive()
        if self.cancel_requested and not self.compensating:
            raise asyncio.CancelledError()
        park = Park(deadline, signal, asyncio.get_running_loop().create_future(), poll)
        self.parks.append(park)
        self.blocked += 1
        try:
            self.check_stuck()
            await park.fut
        finally:
            self.blocked -= 1
            self.parks.remove(park)
            # (the exception leaving here keeps this frame: not the park, whose future holds
            # that exception, a cycle)
            del park


def with_note(detail: str, note: str) -> str:
    """A divergence's detail with the patches' note after it (either may be empty)."""
    return "; ".join(part for part in (detail, note) if part)


def _describe(
    call: Call, name: str, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None
) -> str:
    """A ctx call as a divergence report shows it (a step with its arguments' digest)."""
    text = f"{call}({name!r}"
    if args is not None:
        text += f", args {_serde.digest(args, kwargs or {})}"
    return text + ")"
