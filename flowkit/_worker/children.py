"""Child runs, the engine's side (docs/composing-workflows.md "Children"; the body's side is
``_replay/children.py``): starting a child for a parent's activation (``start_child``,
idempotent by the child's id), reading a child's outcome (``child_run``), waking a parent as
soon as its child settles and cancelling a parent's unfinished children (``Kin``)."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from .._core import limits as limits
from .._core import serde as _serde
from .._core.clock import Clock
from .._core.run import Run, RunStatus, run_tags
from .._model.definition import WorkflowDefinition, definition_of
from .._model.registry import Registry
from .._replay.children import CHILD_POLL, ChildCall, ChildStart, wake_signal
from ..errors import (
    ChildWorkflowError,
    InvalidInputError,
    RunIdTakenError,
    SerializationError,
    WorkflowNotFoundError,
)
from ..events import RunStarted
from ..stores.base import Store, Update
from . import gate as gate
from .chain_ids import predecessor_id
from .recovery import Backoff, is_transient

if TYPE_CHECKING:
    from .port import RunnerPort

log = logging.getLogger("flowkit")

WAKE_TRIES = 5
"""Tries of a parent's wake-up delivery while the store fails transiently."""


def _resolve(registry: Registry, call: ChildCall) -> WorkflowDefinition:
    """The definition a child call names, registered on the parent's worker."""
    if isinstance(call.workflow, str):
        entry = registry.get(call.workflow, call.version)
        if entry is None:
            raise WorkflowNotFoundError(call.workflow, call.version)
        return entry[0]
    defn = definition_of(call.workflow)
    entry = registry.get(defn.name, defn.version) if defn is not None else None
    if defn is None or entry is None or (call.version not in (None, defn.version)):
        raise WorkflowNotFoundError(call.name, call.version or (defn.version if defn else None))
    return entry[0]


def _validated(defn: WorkflowDefinition, input: Any, max_bytes: int) -> tuple[Any, Any]:
    try:
        value = defn.input_adapter.validate_python(input)
        return value, _serde.to_json(value, defn.input_adapter, "workflow input", max_bytes)
    except (ValidationError, SerializationError) as exc:
        raise InvalidInputError(defn.name, str(exc)) from None


def _mine(run: Run, parent_id: str) -> ChildStart:
    """An existing run with the child's id: the child, when it is this parent's."""
    if run.parent_id != parent_id:
        raise RunIdTakenError(run.id)
    return ChildStart(run.id, run.workflow, run.workflow_version)


async def start_child(
    d: RunnerPort, parent: Run, call: ChildCall, trace: Sequence[str] = ()
) -> ChildStart:
    """Start the child ``call`` of ``parent`` (``StoreWindow.start_child``): idempotent by the
    child's id; raises a ``FlowkitError`` (nothing written) when it cannot start. ``trace``:
    the trace tags of its ``run_started`` (``_telemetry.onward_tags``: the parent's trace).

    A singleton parent holding key K of its workflow may not start a child of that workflow
    on K, whatever the limit: the child would wait behind the parent's own slot, and with
    every slot held by a parent awaiting such a child nothing could move."""
    cfg = d.config
    store = d.store
    existing = await store.get_run(call.run_id)
    if existing is not None:
        return _mine(existing, parent.id)
    defn = _resolve(cfg.registry, call)
    limits.check_identifier("run_id", call.run_id, limits.MAX_RUN_ID_LENGTH, defn.name)
    for t in call.tags:
        limits.check_identifier("tag", t, limits.MAX_TAG_LENGTH, defn.name)
    value, input_json = _validated(defn, call.input, cfg.max_payload_bytes)
    key = gate.singleton_key(defn, value, store)
    if key is not None and parent.singleton_key == key and parent.workflow == defn.name:
        raise ChildWorkflowError(
            call.run_id,
            defn.name,
            None,
            f"the parent holds singleton key {key!r} of {defn.name!r}: the child would queue "
            "behind it for ever",
        )
    tags = run_tags(call.tags, key)
    now = d.clock.now()
    timeout = defn.execution_timeout
    # a non-singleton child is created leased here and runs at once (no claim, no poll)
    seat = d.hooks
    claim = key is None and seat.running and seat.room() > 0
    run = Run(
        id=call.run_id,
        workflow=defn.name,
        workflow_version=defn.version,
        status=RunStatus.RUNNING if claim else RunStatus.PENDING,
        input=input_json,
        tags=tuple(tags),
        created_at=now,
        updated_at=now,
        namespace=parent.namespace,
        singleton_key=key,
        lease_owner=d.owner if claim else None,
        lease_expires=round(now + cfg.lease_ttl, 6) if claim else None,
        deadline_at=None if timeout is None else round(now + timeout, 6),
        parent_id=parent.id,
    )
    first = RunStarted(
        seq=1,
        at=now,
        workflow=defn.name,
        version=defn.version,
        input=input_json,
        tags=[*tags, *trace],
    )
    stored, created = await store.create_run(run, [first], queue_cap=gate.queue_cap(defn, key))
    if not created:
        return _mine(stored, parent.id)
    if claim:
        seat.run_claimed(stored, [first])
    else:
        seat.dispatch(stored.id)
    return ChildStart(stored.id, stored.workflow, stored.workflow_version)


async def child_run(store: Store, run_id: str) -> Run | None:
    """The child whose outcome a parent awaits, as the store has it now: the one place that
    reads it. A child that continued as new is followed to its chain's last run (the
    successor keeps ``parent_id``, and its settlement wakes the parent: ``Kin``)."""
    run = await store.get_run(run_id)
    while run is not None and run.continued_as is not None:
        run = await store.get_run(run.continued_as)
    return run


async def known_id(store: Store, run: Run) -> str:
    """The id a parent knows its child ``run`` by: the first run of the child's chain of
    continuations, walked back through predecessors that really continued as this one (an
    id that merely ends in ``~n`` is its own)."""
    current = run.id
    while (pred := predecessor_id(current)) is not None:
        before = await store.get_run(pred)
        if before is None or before.continued_as != current:
            break
        current = pred
    return current


class Kin:
    """What a settlement means for the runs related to it: a settled child wakes its parent
    (it delivers the parent's wake signal for it, which makes a parent suspended on it due now:
    across processes too, as any signal does), and a cancelled run's unfinished children are
    cancelled. Told of every settlement this engine sees (``Settled``); the work runs in tasks
    of its own, right after the settling commit (a crash between the two costs the parent
    ``CHILD_POLL`` seconds of latency, never a hang: it looks again then)."""

    def __init__(
        self,
        store: Store,
        clock: Clock,
        wake: Callable[[str], None],
        cancel: Callable[[str], Any],
        rng: random.Random,
        executing: Callable[[str], bool],
    ) -> None:
        self._store = store
        self._clock = clock
        self._rng = rng
        self._executing = executing
        # parents that were mid-activation here when a child's wake-up reached them: looked at
        # again when that activation ends (``claim``)
        self._recheck: dict[str, set[str]] = {}
        self._wake = wake
        self._cancel = cancel
        self._tasks: set[asyncio.Task[None]] = set()

    def settled(self, run_id: str, run: Run | None) -> None:
        """``run_id`` settled as ``run`` (``None``: its activation here ended unsettled)."""
        if run is None:
            kids = self._recheck.pop(run_id, None)
            if kids:
                self._spawn(self._nudge(run_id, kids))
            return
        self._recheck.pop(run_id, None)
        if not run.status.terminal:
            return
        if run.parent_id is not None and run.continued_as is None:
            # (a child that continued as new: its successor's settlement wakes the parent)
            self._spawn(self._wake_parent(run))
        if run.status is RunStatus.CANCELLED:
            self._spawn(cancel_children(self._store, run.id, self._cancel))

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # (no loop: nothing to do it with; the poll catches it)
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wake_parent(self, child: Run) -> None:
        parent_id = child.parent_id
        assert parent_id is not None
        backoff = Backoff(self._clock, self._rng)
        for tries_left in range(WAKE_TRIES - 1, -1, -1):
            try:
                now = self._clock.now()
                known = await known_id(self._store, child)
                if self._executing(parent_id):
                    # mid-activation here: the store makes its suspension due at once when the
                    # wake-up is in its inbox by then; should the two cross, look when it ends
                    self._recheck.setdefault(parent_id, set()).add(known)
                parent = await self._store.deliver_signal(parent_id, wake_signal(known), None, now)
            except Exception as exc:
                if tries_left and is_transient(exc):
                    await backoff.sleep()
                    continue
                log.warning(
                    "could not wake run %s for its child %s (it looks again within %s s)",
                    parent_id,
                    child.id,
                    CHILD_POLL,
                    exc_info=True,
                )
                return
            if parent.wake_at is not None and parent.wake_at <= now:
                self._wake(parent_id)
            return

    async def _nudge(self, parent_id: str, kids: set[str]) -> None:
        """The activation of ``parent_id`` ended while a child's wake-up was on its way: if it
        suspended waiting for that wake-up and is not due, make it due now."""
        try:
            parent = await self._store.get_run(parent_id)
            now = self._clock.now()
            if (
                parent is None
                or parent.status is not RunStatus.SUSPENDED
                or not {wake_signal(k) for k in kids} & set(parent.waiting_signals)
                or (parent.wake_at is not None and parent.wake_at <= now)
            ):
                return
            res = await self._store.commit(
                parent_id,
                None,
                now,
                Update(wake_at=now, expect_status=frozenset({RunStatus.SUSPENDED})),
            )
        except Exception:  # (it moved meanwhile, or the store failed: the poll catches it)
            log.debug("could not nudge run %s", parent_id, exc_info=True)
            return
        if res.run.wake_at is not None and res.run.wake_at <= now:
            self._wake(parent_id)


async def cancel_children(store: Store, run_id: str, cancel: Callable[[str], Any]) -> None:
    """Request the cancellation of ``run_id``'s unfinished children (``cancel`` is
    ``cancellation.request`` bound to an engine: it cancels their children in turn)."""
    try:
        children = await store.list_runs(parent_id=run_id)
    except Exception:
        log.warning("could not list the children of %s to cancel them", run_id, exc_info=True)
        return
    for child in children:
        if child.status.active and child.status is not RunStatus.CANCELLING:
            try:
                await cancel(child.id)
            except Exception:
                log.warning("could not cancel child %s of %s", child.id, run_id, exc_info=True)


__all__ = ["Kin", "cancel_children", "child_run", "start_child"]
