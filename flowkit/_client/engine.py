"""``Engine``: the public entry point to start, signal, cancel, retry and inspect runs."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Generic, TypeVar, cast, overload

from .._core import limits as _limits
from .._core.clock import Clock, SystemClock
from .._core.run import Run, RunStatus, run_tags
from .._core.telemetry import carried
from .._model.definition import WorkflowDefinition, definition_of
from .._model.history import History
from .._worker import cancellation as _cancellation
from .._worker import gate as gate
from .._worker import retention as _retention
from .._worker.children import Kin
from .._worker.continue_as_new import chain_end
from .._worker.runner import Registry
from .._worker.settlements import Settlements
from .._worker.step_threads import DEFAULT_STEP_THREADS, check_size
from .._worker.worker import Worker, WorkerConfig
from ..errors import (
    InvalidInputError,
    ResultTimeoutError,
    RunNotFoundError,
    RunStateError,
    UnsupportedStoreError,
)
from ..events import RunStarted
from ..stores import limits
from ..stores.base import UNSET, AdmitsOnCreate, Store
from . import publish as _publish
from . import results as _results
from . import retry as _retry
from . import search as _search
from . import serve as _serve
from . import updates as _updates
from .core import ClientCore
from .schedules import Schedule, Schedules
from .schemas import record as record_schemas

T = TypeVar("T")

RESULT_POLL = 0.5
"""Seconds between ``Engine.result``'s reads of a run that may settle where no bus tells it."""
RESULT_POLL_HERE = 5.0
"""The same for a run with an activation on this engine's worker: its end tells the bus."""


class _Setting(Generic[T]):
    """An ``Engine`` attribute kept in its ``WorkerConfig``, so that a change reaches the
    worker too."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Setting[T]: ...
    @overload
    def __get__(self, obj: Engine, owner: type) -> T: ...
    def __get__(self, obj: Engine | None, owner: type) -> _Setting[T] | T:
        if obj is None:
            return self
        value: T = getattr(obj.config, self.name)
        return value

    def __set__(self, obj: Engine, value: T) -> None:
        setattr(obj.config, self.name, value)


class Engine:
    """Runs workflows on a store. ``async with engine:`` starts this instance's worker loops.

    Several engines (tasks, processes, hosts) may share one store; ``worker=False`` makes a
    client that only starts/signals/cancels. The settings live in ``config``, which the
    worker (``_worker.Worker``) runs with; ``crash``, ``executing`` and ``poke`` are what
    ``flowkit_testing.TestEnv`` needs of it."""

    def __init__(
        self,
        store: Store,
        workflows: Iterable[Any] = (),
        *,
        clock: Clock | None = None,
        instance_id: str | None = None,
        namespace: str | None = None,
        worker: bool = True,
        rng: random.Random | None = None,
        lease_ttl: float | timedelta = 30.0,
        poll_interval: float | timedelta | None = 1.0,
        max_concurrency: int = 100,
        blocked_retry: float | timedelta = 60.0,
        bus: Settlements | None = None,
        notify_on_release: bool = True,
        max_payload_bytes: int | None = None,
        step_threads: int = DEFAULT_STEP_THREADS,
        schedules: Mapping[str, Schedule] | None = None,
        retention: float | timedelta | None = None,
    ) -> None:
        rng = rng or random.Random()
        if instance_id is not None:
            limits.check_identifier("instance_id", instance_id, limits.MAX_NAMESPACE_LENGTH)
        if namespace is not None:
            limits.check_identifier("namespace", namespace, limits.MAX_NAMESPACE_LENGTH)
        self.config = WorkerConfig(
            store=store,
            clock=clock or SystemClock(),
            rng=rng,
            instance_id=instance_id or f"engine-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}",
            registry=Registry(),
            # (every duration: seconds or a timedelta, docs/writing-workflows.md)
            lease_ttl=_limits.duration("lease_ttl", lease_ttl, positive=True),
            poll_interval=None
            if poll_interval is None
            else _limits.duration("poll_interval", poll_interval, positive=True),
            max_concurrency=max_concurrency,
            blocked_retry=_limits.duration("blocked_retry", blocked_retry, positive=True),
            notify_on_release=notify_on_release,
            # (None: what the store keeps; docs/stores.md, "Limits")
            max_payload_bytes=limits.payload_limit(store)
            if max_payload_bytes is None
            else max_payload_bytes,
            # the most sync step functions running at once here, each in a thread
            step_threads=check_size(step_threads),
            schedules=dict(schedules or {}),
            retention=None if retention is None else _retention.check_age("retention", retention),
        )
        # the engine's internal plumbing its client modules use (``_client/core.py``)
        self._core = ClientCore(self.config)
        self.namespace = namespace
        self.is_worker = worker
        self.bus = bus or Settlements()
        self.config.recorded = self.bus.recorded
        # durable schedules (docs/schedules.md): ``engine.schedules.create(...)`` and the rest
        self.schedules = Schedules(self, self._core)
        self.config.fire_schedules = self.schedules.fire_due
        self._gate = gate.Gate(store, self.config.clock, rng, lambda: self.config.notify_on_release)
        # what a settlement means for its parent and children (``_children.Kin``)
        self._kin = Kin(
            store, self.config.clock, self._core.wake, self._cancel_child, rng, self.executing
        )
        for wf in workflows:
            self.register(wf)

    store = _Setting[Store]()
    clock = _Setting[Clock]()
    rng = _Setting[random.Random]()
    instance_id = _Setting[str]()
    registry = _Setting[Registry]()
    lease_ttl = _Setting[float]()
    poll_interval = _Setting[float | None]()
    max_concurrency = _Setting[int]()
    blocked_retry = _Setting[float]()
    notify_on_release = _Setting[bool]()
    max_payload_bytes = _Setting[int]()
    # threads for sync step functions (read when the worker starts its first one)
    step_threads = _Setting[int]()
    # failures of a run's store writes, the same way in a row, before the run ends
    # (docs/stores.md, "When the store fails")
    max_store_failures = _Setting[int]()

    # -- registration ------------------------------------------------------------------
    def register(self, wf: Any) -> None:
        """Register a decorated workflow instance (or class with a no-argument constructor).
        Several versions of one name may be registered (docs/writing-workflows.md, "Versions"); the
        same ``(name, version)`` twice raises ``ValueError``."""
        defn = definition_of(wf)
        if defn is None:
            raise TypeError(f"{wf!r} is not a @workflow class or instance")
        if self.registry.get(defn.name, defn.version) is not None:
            raise ValueError(
                f"duplicate workflow {defn.name!r} version {defn.version!r} on one engine"
            )
        instance = wf() if isinstance(wf, type) else wf
        self.registry.add(defn, instance)

    def _definition(self, run: Run) -> WorkflowDefinition | None:
        """The registered definition of the version ``run`` started on, or ``None``."""
        entry = self.registry.get(run.workflow, run.workflow_version)
        return None if entry is None else entry[0]

    # -- lifecycle ---------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        await self.start_worker()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start_worker(self) -> None:
        """Start the dispatch/poll/lease loops (no-op for ``worker=False``)."""
        if self.is_worker and self._core.worker is None:
            await self.schedules.declare()  # (``Engine(schedules=...)``)
            await record_schemas(self.store, self.registry)  # (for callers without the code)
            worker = Worker(self.config, self._settled)
            await worker.take_back_leases()  # (a restart under the same instance id)
            if self._core.worker is None:
                self._core.worker = worker
                worker.start()

    async def stop(self) -> None:
        """Stop the worker loops and release this instance's leases."""
        if self._core.worker is not None:
            w, self._core.worker = self._core.worker, None
            await w.stop(graceful=True)

    async def serve(self, grace: float | timedelta = _serve.DEFAULT_GRACE) -> None:
        """Run the worker until cancelled or SIGTERM/SIGINT, then drain: claim nothing more, let
        activations reach a durable point within ``grace`` s, give the leases back
        (docs/deploying.md). A second signal exits the process at once
        (``flowkit._client.serve``)."""
        await _serve.serve(self, self._core, grace)

    # -- what tools see of the worker (``flowkit_testing.TestEnv``) ---------------------
    async def crash(self) -> None:
        """Stop the worker as a dying process would: its activations are abandoned where
        they are and no lease is given back (they expire, and any instance recovers the
        runs). The engine can start a worker again with ``start_worker``."""
        if self._core.worker is not None:
            w, self._core.worker = self._core.worker, None
            await w.stop(graceful=False)

    def executing(self, run_id: str) -> bool:
        """Whether this engine's worker has ``run_id`` in hand right now: queued for its
        claim, claiming it, or executing it (and renewing its lease)."""
        return (w := self._core.worker) is not None and w.executing(run_id)

    def retry_due(self) -> float | None:
        """The earliest instant at which this engine's worker tries a failed store call
        again (``None``: no activation waits to): a due time for ``TestEnv``'s clock."""
        return None if (w := self._core.worker) is None else w.retry_due()

    def poll_wake(self, run_id: str) -> tuple[float, float | None] | None:
        """With ``config.note_poll_wakes`` (``TestEnv``): the wake time ``run_id``'s last
        suspension by this engine's worker wrote when that is only a fallback look (a parent
        looking at an unsettled child again), with the earliest time something durable is
        due for the run (``None``: never); else ``None``."""
        return None if (w := self._core.worker) is None else w.poll_wake(run_id)

    def steps_in_flight(self) -> frozenset[object]:
        """The step attempts this engine's worker runs right now, by an opaque token each
        (``TestEnv`` moves its virtual clock only once they have ended)."""
        return frozenset() if (w := self._core.worker) is None else w.steps_in_flight()

    def step_ended(self) -> asyncio.Future[None] | None:
        """A future resolved when the next step attempt of this engine's worker ends
        (``None`` without a running worker)."""
        return None if (w := self._core.worker) is None else w.step_ended()

    def poke(self) -> None:
        """Have the worker poll the store now rather than at its next deadline (new work
        may be due); a no-op without a running worker."""
        if self._core.worker is not None:
            self._core.worker.poke()

    # -- starting ----------------------------------------------------------------------
    async def start(
        self,
        workflow: Any,
        input: Any = None,
        run_id: str | None = None,
        *,
        tags: Sequence[str] = (),
        version: str | None = None,
        search: Mapping[str, Any] | None = None,
    ) -> Run:
        """Create a run (idempotent by ``run_id``) and hand it to a worker.

        The run takes the newest registered version of the workflow (natural order:
        ``flowkit._model.registry.natural_key``) unless ``version`` pins one; a class or instance
        passed as ``workflow`` means its own version. A version not registered here raises
        ``WorkflowNotFoundError`` and writes nothing. An existing ``run_id`` returns that run
        as it is, even where a new start would be refused (input the current code rejects, a
        store without singleton admission). ``search`` sets its first search attributes
        (docs/updates.md; a bad one raises ``InvalidInputError``, nothing written)."""
        defn = self._core.resolve(workflow, version)
        if run_id is not None:
            limits.check_identifier("run_id", run_id, limits.MAX_RUN_ID_LENGTH, defn.name)
        if isinstance(tags, str) or not all(isinstance(t, str) for t in tags):
            raise TypeError("tags must be a sequence of strings")
        for t in tags:
            limits.check_identifier("tag", t, limits.MAX_TAG_LENGTH, defn.name)
        # (search attributes: docs/search-and-retention.md)
        attrs = _search.start_attrs(search, defn.name)
        try:
            input_json, clean, key = self._admissible(defn, input, tags)
        except (InvalidInputError, UnsupportedStoreError):
            existing = await self.store.get_run(run_id) if run_id is not None else None
            if existing is not None:
                return existing  # idempotent: the run exists, nothing is decided again
            raise
        cfg = self.config
        if run_id is None:
            run_id = str(uuid.UUID(int=cfg.rng.getrandbits(128), version=4))
        now = cfg.clock.now()
        # (durable: the deadline is stored with the run, so a crash or restart does not reset it)
        timeout = defn.execution_timeout
        deadline = None if timeout is None else round(now + timeout, 6)
        # A worker with free capacity creates the run already claimed by itself and runs it at
        # once: one transaction less per run, and no window in which another instance could
        # take it first. Otherwise the run waits `pending` for any worker's poll.
        claim = (w := self._core.worker) is not None and w.has_capacity()
        run = Run(
            id=run_id,
            workflow=defn.name,
            workflow_version=defn.version,
            status=RunStatus.RUNNING if claim else RunStatus.PENDING,
            input=input_json,
            tags=tuple(clean),
            created_at=now,
            updated_at=now,
            namespace=self.namespace,
            singleton_key=key,
            lease_owner=cfg.instance_id if claim else None,
            lease_expires=round(now + cfg.lease_ttl, 6) if claim else None,
            deadline_at=deadline,
            search=attrs,
        )
        first = RunStarted(
            seq=1, at=now, workflow=defn.name, version=defn.version, input=input_json, tags=clean
        )
        first = first if (tel := cfg.telemetry) is None else carried(tel, first, run_id)
        cap = gate.queue_cap(defn, key)
        admission = (
            self._gate.admission(defn, key, now, deadline) if claim and key is not None else None
        )
        created = False
        try:
            if admission is not None:
                stored, created = await cast(AdmitsOnCreate, cfg.store).create_run(
                    run, [first], queue_cap=cap, admission=admission
                )
            else:
                stored, created = await cfg.store.create_run(run, [first], queue_cap=cap)
        finally:
            if tel is not None:  # (created, an idempotent re-start, or refused)
                tel.run_started(defn.name, run_id, created)
        if not created:
            return stored
        worker = self._core.worker
        if claim and worker is not None:
            if not self._gate.parked(admission, stored):
                worker.run_claimed(stored, self._gate.claimed_events(first, admission))
            elif stored.wake_at is not None:  # its gate re-check: the poller must not sleep past
                worker.wake_by(stored.wake_at)
        else:
            self._core.wake(run_id)
        return stored

    def _admissible(
        self, defn: WorkflowDefinition, input: Any, tags: Sequence[str]
    ) -> tuple[Any, list[str], str | None]:
        """Validate a new run's input and singleton key: its stored input, its tags (the
        singleton tag first) and its key. Raises before anything is written."""
        value, input_json = self._core.validated(defn, input)
        key = gate.singleton_key(defn, value, self.store)
        return input_json, run_tags(tags, key), key

    async def signal(self, run_id: str, name: str, payload: Any = None) -> None:
        """Deliver a signal; it is buffered until a ``wait_for_signal(name)`` consumes it. A
        payload type the workflow declares (``@workflow(signals={name: T})``) validates it
        first, and a workflow that declares its messages refuses other names
        (``InvalidInputError``, nothing written; without the code here, by the schemas its
        workers recorded: docs/updates.md). A run that continued as new
        (``Run.continued_as``) passes it on to the last run of its chain."""
        limits.check_identifier("signal name", name, limits.MAX_SIGNAL_NAME_LENGTH)
        # a run that continued as new passes it on to the last run of its chain (the store
        # follows the chain too, should it continue meanwhile)
        run = await chain_end(self.store, await self._core.get(run_id))
        # (name and payload checked: the code's declarations, else the recorded schemas)
        data = await _updates.signal_payload(self, run, name, payload)
        if run.status.terminal:
            raise RunStateError(run.id, run.status, f"signal {name!r} cannot be delivered")
        now = self.clock.now()
        run = await self.store.deliver_signal(run.id, name, data, now)
        if run.wake_at is not None and run.wake_at <= now:
            self._core.wake(run.id)

    async def signal_with_start(
        self, workflow: Any, input: Any, run_id: str, signal: str, payload: Any = None
    ) -> Run:
        """``start`` (idempotent) then ``signal``; it does not bypass the singleton gate."""
        run = await self.start(workflow, input, run_id)
        await self.signal(run_id, signal, payload)
        return run

    async def cancel(self, run_id: str, *, compensate: bool = False) -> Run:
        """Request cancellation; a run that never got past its singleton gate (or never
        started) settles ``cancelled`` at once. Cancelling a settled run is a no-op.

        ``compensate=True``: once the body has let the cancellation out, the compensations
        its completed steps registered (``ctx.step(..., compensate=undo)``) run in reverse
        order before the run settles ``cancelled``; without it they do not run."""
        if not isinstance(compensate, bool):
            raise InvalidInputError(None, f"compensate= takes a bool, got {compensate!r}")
        if not limits.storable(run_id):  # (no store holds such an id)
            raise RunNotFoundError(run_id)
        run = await _cancellation.request(
            self.store,
            self.clock,
            self.registry,
            run_id,
            reason=None,
            compensate=compensate,
            settled=self._settled,
            wake=self._core.wake,
            deliver=lambda rid: (w := self._core.worker) is not None and w.cancel_local(rid),
            telemetry=self.config.telemetry,
        )
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def _settled(self, run_id: str, run: Run | None) -> None:
        """A run settled (or left this worker unsettled: ``None``): ``result`` waiters hear
        of it, and so do its parent and children (``Kin``)."""
        self.bus.settled(run_id, run)
        self._kin.settled(run_id, run)

    async def _cancel_child(self, run_id: str) -> None:
        """Cancel a child of a cancelled run (``Kin``), as ``cancel`` does, compensating when
        its parent's cancellation asked for it (the same flag ``cancel``'s own pass over the
        children passes: whichever lands first, the child is cancelled the same way)."""
        child = await self.store.get_run(run_id)
        compensate = False
        if child is not None and child.parent_id is not None:
            asked = [
                e
                for e in await self.store.load_events(child.parent_id)
                if e.type == "cancel_requested"
            ]
            compensate = bool(asked) and bool(getattr(asked[-1], "compensate", False))
        await _cancellation.request(
            self.store,
            self.clock,
            self.registry,
            run_id,
            reason=None,
            compensate=compensate,
            settled=self._settled,
            wake=self._core.wake,
            deliver=lambda rid: (w := self._core.worker) is not None and w.cancel_local(rid),
            telemetry=self.config.telemetry,
        )

    async def retry(self, run_id: str, *, input: Any = UNSET) -> Run:
        """Re-open a ``failed`` or ``dead`` run: it replays its completed steps and runs the
        failed one (or the lost activation) again, with its recovery count reset and, when the
        workflow has an ``execution_timeout``, a fresh deadline from now. ``input`` replaces
        the run's input: validated as ``start`` validates it (``InvalidInputError``, nothing
        written; without the workflow's code here, against the input schema its workers
        recorded, ``WorkflowNotFoundError`` when none did), recorded in ``run_retried``, and
        what the body gets from now on. A singleton run keeps its key (the one its original
        input gave) and must claim a slot again."""
        return await _retry.retry(self, self._core, run_id, input)

    # -- results and queries -----------------------------------------------------------
    async def result(self, run_id: str, timeout: float | timedelta | None = None) -> Any:
        """Wait for the run to settle; return its output or raise ``WorkflowFailedError`` /
        ``RunCancelledError``. A run that continued as new (``Run.continued_as``) is followed
        to the last run of its chain, whose outcome it is. ``timeout`` (real seconds) raises
        ``ResultTimeoutError`` (a ``TimeoutError``) saying the status of the chain's current
        run and why it may not have moved. ``timeout`` may be a ``timedelta``; ``None`` or
        ``math.inf``: none."""
        timeout = _limits.timeout("result timeout=", timeout)
        chain = [run_id]  # (the run the wait is at: a continue-as-new moves it on)
        try:
            async with asyncio.timeout(timeout):
                return await self._wait_settled(run_id, chain)
        except TimeoutError as exc:
            if isinstance(exc, ResultTimeoutError) or timeout is None:
                raise
            run_id = chain[-1]
            run = await self.store.get_run(run_id)
            while run is not None and run.status.terminal and run.continued_as is not None:
                run_id = run.continued_as
                run = await self.store.get_run(run_id)
            if run is None:
                raise RunNotFoundError(run_id) from None
            if run.status.terminal:  # settled as the timeout struck
                return self._outcome(run)
            hint = _results.stall_hint(
                run, self.clock.now(), self.is_worker, self._core.worker is not None
            )
            missing = await _results.version_missing(self.store, run, self.clock.now())
            if missing is not None:
                hint = f"{missing}; {hint}"
            raise ResultTimeoutError(run_id, run.status.value, timeout, hint) from None

    async def _wait_settled(self, run_id: str, chain: list[str]) -> Any:
        """Until the run settles. The settling commit of any engine on this bus wakes it with
        the settled snapshot, and a run that leaves this engine's worker unsettled wakes it
        for a fresh read. No store says when a run settled elsewhere (another process, an
        engine with a bus of its own; ``watch`` tells of claimable work only), so a run
        without an activation here is read again every ``RESULT_POLL`` seconds; one with an
        activation here only every ``RESULT_POLL_HERE``. A run that continued as new
        (``Run.continued_as``) is followed to its successor, to the chain's last run; each id
        is appended to ``chain``."""
        read = not self.executing(run_id)  # executing here: its settlement comes by the bus
        while True:
            fut = self.bus.waiter(run_id)  # first, so a settlement cannot slip between
            try:
                settled: Run | None = await self._core.get(run_id) if read else None
                if settled is None or not settled.status.terminal:
                    here = (w := self._core.worker) is not None and w.holds(run_id)
                    await asyncio.wait({fut}, timeout=RESULT_POLL_HERE if here else RESULT_POLL)
                    got = fut.result() if fut.done() else None
                    settled = got if isinstance(got, Run) else None
            finally:
                self.bus.discard(run_id, fut)
            read = True
            if settled is not None and settled.status.terminal:
                if settled.continued_as is None:
                    return self._outcome(settled)  # (the settling commit's own snapshot)
                run_id = settled.continued_as  # on to the successor
                chain.append(run_id)
                read = not self.executing(run_id)

    def _outcome(self, run: Run) -> Any:
        """The output of a settled run, or the error it raises (``_results.outcome``)."""
        return _results.outcome(self._definition(run), run)

    async def get_run(self, run_id: str) -> Run:
        """The run's current snapshot; ``RunNotFoundError`` for an unknown id."""
        return await self._core.get(run_id)

    async def list_runs(
        self,
        workflow: str | None = None,
        status: RunStatus | str | None = None,
        tag: str | None = None,
        *,
        search: Mapping[str, Any] | None = None,
        limit: int | None = None,
        after: Run | None = None,
        parent_id: str | None = None,
    ) -> list[Run]:
        """Run snapshots without payloads (``input``, ``output``, ``error`` are ``None``:
        ``get_run`` has them), oldest first; ``parent_id`` keeps the children of that run;
        ``search`` filters by search attributes (a value, or ``(op, value)``); ``limit`` /
        ``after`` (the last run of the previous page) page through them."""
        st = RunStatus(status) if status is not None else None
        return await _search.list_runs(self, workflow, st, tag, search, limit, after, parent_id)

    # -- talking to runs (docs/updates.md) ---------------------------------------------------
    async def get_event(
        self, run_id: str, key: str, timeout: float | timedelta | None = None
    ) -> Any:
        """The latest value run ``run_id`` published under ``key`` (``ctx.set_event``),
        waiting up to ``timeout`` real seconds for the first one; ``None`` if none came."""
        return await _publish.get_event(self, self._core, run_id, key, timeout)

    async def publish_event(self, name: str, payload: Any, *, event_id: str | None = None) -> Any:
        """Deliver an event to every run waiting for ``name`` whose ``match`` it satisfies, or
        buffer it for the first later one; start the runs of ``@workflow(on_event=name)``.
        An ``event_id`` already published is delivered once only."""
        return await _publish.publish_event(self, self._core, name, payload, event_id)

    async def update(
        self, run_id: str, name: str, arg: Any = None, *, timeout: float | timedelta | None = None
    ) -> Any:
        """Send update ``name`` to a running run and return its ``upd.reply(value)``."""
        return await _updates.update(self, self._core, run_id, name, arg, timeout)

    async def prune(
        self,
        older_than: float | timedelta,
        *,
        workflow: str | None = None,
        status: RunStatus | str | None = None,
    ) -> int:
        """Delete terminal runs settled more than ``older_than`` (seconds or a ``timedelta``)
        ago (histories,
        signals, search rows, published values); how many. Never an active run or the child
        of an active parent."""
        st = RunStatus(status) if status is not None else None
        return await _retention.prune(self, older_than, workflow, st)

    async def history(self, run_id: str) -> History:
        """The run's ``History``."""
        await self._core.get(run_id)
        return History(run_id, await self.store.load_events(run_id))
