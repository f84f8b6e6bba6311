"""Continue-as-new (docs/composing-workflows.md): settle a run whose body called
``ctx.continue_as_new(input)``.

One commit settles the run ``completed`` (``run_continued`` right before ``run_completed``)
and creates its successor ``f"{base}~{n}"`` (``Update.successor``, a store with
``continues_as_new``): same workflow and version, the new input, a fresh history and a fresh
``execution_timeout`` deadline, the run's tags (not the reserved ones) and ``parent_id``. A
singleton holder passes its slot on in that transaction (its ``singleton_released``, the
successor's ``singleton_admitted``, no waiter notified), so the successor never queues behind
the key's waiters. The successor is leased to this worker and executed at once (``handed``),
so a loop costs no poll. A pending cancel wins: the run settles ``cancelled``, no successor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._core.run import ADMITTED_TAG, Run, RunStatus, run_tags
from .._model.definition import WorkflowDefinition
from .._replay import Cancelled, Continued, Failed, Outcome, Suspended, error_info
from ..errors import ConflictError, InvalidInputError, UnsupportedStoreError
from ..events import ErrorInfo, Event, RunCompleted, RunContinued, RunStarted, SingletonAdmitted
from ..stores import limits
from ..stores.base import Notify, Store, Successor, Update, continues_as_new
from . import gate as gate
from .chain_ids import base_id, predecessor_id, successor_id
from .port import Try

if TYPE_CHECKING:
    from .port import RunnerPort


async def chain_end(store: Store, run: Run) -> Run:
    """The last run of ``run``'s continue-as-new chain (``run`` itself unless it continued
    as new): where a signal or update sent to it goes (docs/composing-workflows.md)."""
    while run.status.terminal and run.continued_as is not None:
        nxt = await store.get_run(run.continued_as)
        if nxt is None:
            break  # (pruned: the last run there is)
        run = nxt
    return run


async def settle(
    drive: RunnerPort,
    run: Run,
    input_json: object,
    defn: WorkflowDefinition,
    admitted: bool,
    notify: Notify | None,
    pending: Sequence[Event],
    t: Try,
    trace: Sequence[str] = (),
) -> Outcome:
    """Commit a ``Continued`` outcome of ``run`` (its new input ``input_json``, validated by
    the activation; ``trace``: the trace tags of the successor's ``run_started``,
    ``_telemetry.onward_tags``): the run and its successor in one transaction, or the run ``failed``
    (the successor cannot be made: a store without ``continues_as_new``, an id or a singleton
    key no store keeps, a successor id taken by another run), or ``cancelled`` (a cancel
    landed first). Answers the outcome committed (for an observer: ``Continued``, or what
    the run settled as instead; ``Suspended``: a cancel landed meanwhile, the run is given
    back to settle in its next activation). Raises what the store raised otherwise (the
    drive's retry rules)."""

    async def finish(outcome: Failed | Cancelled, base: Run = run) -> Failed | Cancelled:
        await drive.settle(base, outcome, admitted, notify, pending, t)
        return outcome

    def failed(exc: Exception) -> Failed:
        return Failed(error_info(exc))

    if run.status is RunStatus.CANCELLING:
        return await finish(Cancelled())
    store = drive.store
    if not continues_as_new(store):
        why = f"{type(store).__name__} cannot continue a run as new (no continues_as_new)"
        return await finish(failed(UnsupportedStoreError(why)))
    sid = successor_id(run.id)
    try:
        limits.check_identifier("run_id", sid, limits.MAX_RUN_ID_LENGTH, defn.name)
        value = defn.input_adapter.validate_python(input_json)
        key = gate.singleton_key(defn, value, store)
    except (InvalidInputError, UnsupportedStoreError) as exc:
        return await finish(failed(exc))
    cfg = drive.config
    now = drive.clock.now()
    # the key's slot goes to the successor directly when it keeps the key
    passing = admitted and key is not None and key == run.singleton_key
    leased = drive.hooks.running
    clean = run_tags(run.tags, key)
    timeout = defn.execution_timeout
    nxt = Run(
        id=sid,
        workflow=run.workflow,
        workflow_version=run.workflow_version,
        status=RunStatus.RUNNING if leased else RunStatus.PENDING,
        input=input_json,
        tags=(*clean, ADMITTED_TAG) if passing else tuple(clean),
        created_at=now,
        updated_at=now,
        namespace=run.namespace,
        singleton_key=key,
        lease_owner=cfg.instance_id if leased else None,
        lease_expires=round(now + cfg.lease_ttl, 6) if leased else None,
        deadline_at=None if timeout is None else round(now + timeout, 6),
        parent_id=run.parent_id,
    )
    first: list[Event] = [
        RunStarted(
            seq=1,
            at=now,
            workflow=run.workflow,
            version=run.workflow_version,
            input=input_json,
            tags=[*clean, *trace],
        )
    ]
    if passing:
        assert key is not None
        first.append(SingletonAdmitted(seq=2, key=key, at=now))
    update = Update(
        events=[
            *pending,
            *gate.Gate.released(run, admitted, now),
            RunContinued(next_run_id=sid, input=input_json, at=now),
            RunCompleted(output=None, at=now),
        ],
        status=RunStatus.COMPLETED,
        output=None,
        error=None,
        # a slot passed on wakes no waiter; one left (another key) wakes them as a settling does
        notify=None if passing else notify,
        expect_status=frozenset({RunStatus.RUNNING}),
        successor=Successor(nxt, tuple(first)),
    )
    t.op = "commit of the continued outcome"
    t.pending = list(pending)
    try:
        await drive.commit(run, update, t)
    except ConflictError:
        # a cancel landed meanwhile (it wins), or the successor's id is another run's
        fresh = await store.get_run(run.id)
        if fresh is None or fresh.lease_owner != drive.owner or not fresh.status.active:
            raise
        if fresh.status is RunStatus.CANCELLING:
            # the cancel wins: keep what this activation recorded and give the run back, so
            # that the next activation replays it as a cancellation (its compensations run
            # first when the cancel asked for them) and settles it cancelled
            await drive.commit(fresh, Update(events=list(pending), release_lease=True), t)
            return Suspended(None, ())
        taken = await store.get_run(sid)
        if taken is None:
            raise
        info = ErrorInfo(
            type="ConflictError",
            message=f"ctx.continue_as_new(): the successor id {sid!r} is taken by another run",
        )
        return await finish(Failed(info), fresh)
    if not leased:
        drive.hooks.dispatch(sid)
    return Continued(input_json)


async def adopt(drive: RunnerPort, run: Run) -> None:
    """A continuation whose commit failed in flight had landed (a fresh read finds ``run``
    settled with ``continued_as``): its successor is leased here but nobody executes it.
    Resume it at once rather than leave it until its lease expires. Best effort."""
    sid = run.continued_as
    if sid is None:
        return
    try:
        nxt = await drive.store.get_run(sid)
    except Exception:
        return  # (its lease expires; any worker recovers it then)
    seat = drive.hooks
    if (
        nxt is not None
        and nxt.status.active
        and nxt.lease_owner == drive.owner
        and not seat.executing(sid)
    ):
        seat.resume(sid)


__all__ = ["adopt", "base_id", "chain_end", "predecessor_id", "settle", "successor_id"]
