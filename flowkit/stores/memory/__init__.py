"""``MemoryStore``: the reference store, for tests and demos.

Every method runs without awaiting inside its critical section, so on one event loop each call
is atomic. ``scoped(namespace)`` returns a view over the same data that sees only one
namespace. The rules it applies are those of every store (``flowkit.stores.rules``)."""

from __future__ import annotations

import copy
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import singleton as _sg
from ..._core.run import ADMITTED_TAG, Run, RunStatus
from ..._core.search_terms import Term, upserts
from ...errors import ConflictError, RunIdTakenError, RunNotFoundError, SingletonQueueFullError
from ...events import Event
from .. import limits as _limits
from .._gated import decide, gated_limit, parked
from ..base import (
    Admission,
    AdmittedAt,
    CommitResult,
    GateCheck,
    HandOff,
    InboxSignal,
    QueueCap,
    Update,
    WorkerSeen,
    WorkflowVersions,
    admission_time,
    moves_to_successor,
)
from ..codec._mark import (
    CODEC_META_KEY,
    CodecMark,
    events_carry_payload,
    refuse,
    run_carries_payload,
    update_carries_payload,
)
from ..rules import (
    admit_new,
    admitted_event,
    apply_update,
    check_commit,
    claimable,
    due_time,
    lost_activation,
    of_versions,
    plan_release,
)
from ..schedules import ScheduleRecord
from ._browse import MemoryBrowse
from ._events import MemoryEventData, MemoryEvents
from ._lists import listed, prunable
from ._schedules import MemorySchedules


@dataclass
class _Data:
    runs: dict[str, Run] = field(default_factory=dict)
    events: dict[str, list[Event]] = field(default_factory=dict)
    inbox: dict[str, list[InboxSignal]] = field(default_factory=dict)
    # (workflow, tag) -> ids of active runs carrying it: admission reads only its own key
    by_tag: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    meta: dict[str, str] = field(default_factory=dict)  # (the encryption marker)
    # (namespace, instance id) -> what that worker made known (``base.RecordsWorkers``)
    workers: dict[tuple[str | None, str], WorkerSeen] = field(default_factory=dict)
    # (namespace or '', workflow, version) -> its schemas (``base.RecordsSchemas``)
    schemas: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    # (namespace, schedule id) -> its row (``schedules.KeepsSchedules``, ``MemorySchedules``)
    schedules: dict[tuple[str | None, str], ScheduleRecord] = field(default_factory=dict)
    signal_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    # published events (``base.PublishesEvents``, ``_events.MemoryEvents``)
    events_data: MemoryEventData = field(default_factory=MemoryEventData)
    # bumped by every write to the runs or their histories (``change_stamp``)
    version: int = 0


class MemoryStore(MemorySchedules, MemoryEvents, MemoryBrowse):
    """An in-process store (see ``flowkit.stores.base.Store`` for the contract)."""

    admits_on_create = True
    records_admission = True
    """``create_run`` takes an ``Admission`` (``flowkit.stores.base.AdmitsOnCreate``)."""
    appends_events = True
    """``append_events`` records a running step (``flowkit.stores.base.AppendsEvents``)."""
    claims_by_version = True
    """``claim``/``due_runs`` take ``versions`` (``flowkit.stores.base.ClaimsByVersion``)."""
    records_workers = True
    """It keeps what workers make known (``flowkit.stores.base.RecordsWorkers``)."""
    records_schemas = True
    """It keeps workers' workflow schemas (``flowkit.stores.base.RecordsSchemas``)."""
    continues_as_new = True
    """``commit`` creates ``Update.successor`` (``flowkit.stores.base.ContinuesAsNew``)."""
    publishes_events = True
    """``publish_event``/``take_event`` (``flowkit.stores.base.PublishesEvents``)."""
    claims_gated = True  # (``claim(gate=)`` decides a re-check: ``base.ClaimsGated``)

    def __init__(
        self,
        namespace: str | None = None,
        *,
        max_payload_bytes: int = _limits.DEFAULT_MAX_PAYLOAD_BYTES,
        _data: _Data | None = None,
    ) -> None:
        if namespace is not None:
            _limits.check_identifier("namespace", namespace, _limits.MAX_NAMESPACE_LENGTH)
        self.namespace = namespace
        self.max_payload_bytes = max_payload_bytes
        """The largest payload it keeps, in bytes of JSON (docs/stores.md, "Limits")."""
        self._d = _data if _data is not None else _Data()
        self._schedules = self._d.schedules
        self._mark = CodecMark()

    def scoped(self, namespace: str) -> MemoryStore:
        """A view over the same data that reads and writes only ``namespace``."""
        return MemoryStore(namespace, max_payload_bytes=self.max_payload_bytes, _data=self._d)

    # -- the encryption marker (flowkit.stores.codec._mark) ------------------------------
    def bind_codec(self, marker: str) -> None:
        """Called by a ``CodecStore`` wrapping this object: its payloads come encoded, and
        ``marker`` is recorded in the store's metadata on the first write through it."""
        self._mark.bind(marker)

    async def codec_marker(self) -> str | None:
        """The marker a ``CodecStore`` recorded (``None``: payloads are stored in clear)."""
        return self._d.meta.get(CODEC_META_KEY)

    def _guard(self) -> str | None:
        """Record the bound marker; on a plain store, the marker its payload writes must
        respect (``None``: payloads are stored in clear here)."""
        mark = self._mark
        if mark.bound is not None:
            self._d.meta.setdefault(CODEC_META_KEY, mark.bound)
            mark.settled = True
            return None
        return self._d.meta.get(CODEC_META_KEY)

    # -- helpers -----------------------------------------------------------------------
    def _visible_runs(self) -> Iterable[Run]:
        return (r for r in self._d.runs.values() if self._visible(r))

    def _active_runs(self) -> Iterable[Run]:
        runs = self._d.runs
        return (r for r in (runs[i] for i in self._d.active) if self._visible(r))

    def _version(self) -> int:
        return self._d.version

    def _visible(self, run: Run) -> bool:
        return self.namespace is None or run.namespace == self.namespace

    def _get(self, run_id: str) -> Run:
        run = self._d.runs.get(run_id)
        if run is None or not self._visible(run):
            raise RunNotFoundError(run_id)
        return run

    def _sharing(self, workflow: str, tag: str) -> list[Run]:
        ids = self._d.by_tag.get((workflow, tag), ())
        return [r for r in (self._d.runs[i] for i in ids) if self._visible(r)]

    def _deciding(
        self, workflow: str, tag: str, limit: int | None, me: Run | None = None
    ) -> list[Run]:
        """What an admission or a release of ``tag`` decides over (as the SQL stores read it):
        the key's holders and its oldest waiters, as many as ``limit`` could admit (the
        oldest one when the limit is unknown); plus ``me`` when it shares the key. The other
        waiters cannot change a decision of ``flowkit.singleton``'s helpers, so a denied
        re-check behind 10,000 waiters costs what one behind none does, and no call sorts
        the whole queue."""
        d = self._d
        ids = d.by_tag.get((workflow, tag), set())
        marked = d.by_tag.get((workflow, ADMITTED_TAG), set())
        few, many = (ids, marked) if len(ids) <= len(marked) else (marked, ids)
        out = [r for r in (d.runs[i] for i in few if i in many) if self._visible(r)]
        # (an unknown limit: a release wakes the oldest waiter whatever the holders; read
        # even when the holders fill every slot: they are the heads of the queue, the
        # waiters that keep a re-check timer, ``singleton.heads``)
        room = 1 if limit is None else limit
        waiting = (
            r
            for r in (d.runs[i] for i in ids if i not in marked)
            if r.status is not RunStatus.CANCELLING and self._visible(r)
        )
        out += heapq.nsmallest(room, waiting, key=lambda r: (r.created_at, r.id))
        if me is not None and me.id in ids and all(r.id != me.id for r in out):
            out.append(me)
        return out

    def _put(self, run: Run) -> None:
        old = self._d.runs.get(run.id)
        self._d.runs[run.id] = run
        self._d.version += 1
        keys_old = {(old.workflow, t) for t in old.tags} if old and old.status.active else set()
        keys_new = {(run.workflow, t) for t in run.tags} if run.status.active else set()
        for k in keys_old - keys_new:
            bucket = self._d.by_tag.get(k)
            if bucket is not None:
                bucket.discard(run.id)
                if not bucket:
                    del self._d.by_tag[k]
        for k in keys_new - keys_old:
            self._d.by_tag.setdefault(k, set()).add(run.id)
        if run.status.active:
            self._d.active.add(run.id)
        else:
            self._d.active.discard(run.id)

    def _append(self, run_id: str, events: Sequence[Event]) -> tuple[int, ...]:
        self._d.version += 1
        log = self._d.events.setdefault(run_id, [])
        seqs = []
        for ev in events:
            seq = len(log) + 1
            log.append(ev.model_copy(update={"seq": seq}))
            seqs.append(seq)
        return tuple(seqs)

    # -- the contract ------------------------------------------------------------------
    async def create_run(
        self,
        run: Run,
        events: Sequence[Event],
        *,
        queue_cap: QueueCap | None = None,
        admission: Admission | None = None,
    ) -> tuple[Run, bool]:
        if not self._mark.settled and (found := self._guard()) is not None:
            gated = admission.gated if admission is not None else ()
            if run_carries_payload(run, [*events, *gated]):
                raise refuse(found, f"create run {run.id!r} with a payload")
        _limits.check_run(run, events, self.max_payload_bytes)
        existing = self._d.runs.get(run.id)
        if existing is not None:
            if not self._visible(existing):
                raise RunIdTakenError(run.id)
            return existing, False
        if queue_cap is not None:
            bucket = self._d.by_tag.get((queue_cap.workflow, queue_cap.tag), ())
            count = (
                len(bucket)
                if self.namespace is None
                else sum(self._visible(self._d.runs[i]) for i in bucket)
            )
            if count >= queue_cap.capacity:
                raise SingletonQueueFullError(
                    queue_cap.workflow, queue_cap.key, queue_cap.max_queue_depth, queue_cap.limit
                )
        if self.namespace is not None and run.namespace is None:
            run = dataclasses.replace(run, namespace=self.namespace)
        if admission is not None:
            sharing = self._deciding(admission.workflow, admission.tag, admission.limit)
            run, events = admit_new(run, events, admission, sharing)
        self._put(run)
        self._append(run.id, events)
        return run, True

    async def get_run(self, run_id: str) -> Run | None:
        run = self._d.runs.get(run_id)
        return run if run is not None and self._visible(run) else None

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
        parent_id: str | None = None,
        search: Sequence[Term] = (),
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        return listed(
            (r for r in self._d.runs.values() if self._visible(r)),
            workflow=workflow,
            status=status,
            tag=tag,
            limit=limit,
            parent_id=parent_id,
            search=search,
            after=after,
        )

    async def prune_runs(
        self,
        settled_before: float,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        limit: int = 500,
    ) -> int:
        d = self._d
        ids = prunable(
            (r for r in d.runs.values() if self._visible(r)),
            d.runs.get,
            settled_before=settled_before,
            workflow=workflow,
            status=status,
            limit=limit,
        )
        d.version += 1
        for rid in ids:  # (terminal: in no tag bucket, not active)
            del d.runs[rid]
            d.events.pop(rid, None)
            d.inbox.pop(rid, None)
        gone = set(ids)
        ed = d.events_data
        for key in [k for k in ed.waits if k[0] in gone]:
            del ed.waits[key]
        if workflow is None and status is None:
            # published events of no run, by age: the buffer and the event-id dedupe
            ns = self.namespace
            ed.buffer[:] = [b for b in ed.buffer if b.namespace != ns or b.at >= settled_before]
            for dedupe in [
                k for k, at in ed.published.items() if k[0] == ns and at < settled_before
            ]:
                del ed.published[dedupe]
        return len(ids)

    async def load_events(self, run_id: str) -> list[Event]:
        self._get(run_id)
        return list(self._d.events.get(run_id, ()))

    async def latest_event(self, run_id: str, type: str, field: str, value: str) -> Event | None:
        """``base.LatestEvent``: the run's newest event of ``type`` whose ``field`` is
        ``value`` (``None``: none, or no such run)."""
        for ev in reversed(self._d.events.get(run_id, ())):
            if ev.type == type and getattr(ev, field, None) == value:
                return ev
        return None

    async def claim(
        self,
        run_id: str,
        owner: str,
        now: float,
        lease_expires: float,
        *,
        versions: WorkflowVersions | None = None,
        gate: GateCheck | None = None,
    ) -> Run | None:
        if not self._mark.settled and (found := self._guard()) is not None:
            raise refuse(found, f"claim run {run_id!r} (running it needs its payloads)")
        run = self._d.runs.get(run_id)
        if (
            run is None
            or not self._visible(run)
            or not claimable(run, now)
            or not of_versions(run, versions)
        ):
            return None
        limit = None if gate is None else gated_limit(run, now, gate)
        if gate is not None and limit is not None:  # a gated re-check (``ClaimsGated``)
            tag = run.singleton_tag or ""
            d = decide(
                run,
                self._deciding(run.workflow, tag, limit, run),
                limit,
                gate,
                owner,
                now,
                lease_expires,
            )
            self._put(d.run)
            self._append(run_id, d.events)
            self._arm_heads(run.workflow, tag, limit, d.arm_at)
            return d.run if d.admitted else parked(d.run)
        status = RunStatus.CANCELLING if run.status is RunStatus.CANCELLING else RunStatus.RUNNING
        new = dataclasses.replace(
            run,
            status=status,
            wake_at=None,
            lease_owner=owner,
            lease_expires=lease_expires,
            updated_at=now,
            recoveries=run.recoveries + lost_activation(run),
        )
        self._put(new)
        return new

    async def release_leases(self, owner: str, now: float) -> list[str]:
        released = []
        for rid in sorted(self._d.active):
            run = self._d.runs[rid]
            if run.lease_owner == owner and self._visible(run):
                self._put(
                    dataclasses.replace(
                        run,
                        lease_owner=None,
                        lease_expires=None,
                        updated_at=now,
                        recoveries=run.recoveries + lost_activation(run),
                    )
                )
                released.append(rid)
        return released

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        run = self._d.runs.get(run_id)
        if run is None or run.lease_owner != owner or not run.status.active:
            return None
        if run.lease_expires is not None and run.lease_expires > lease_expires:
            return run  # (a renewal never shortens a lease: a late one lands after a newer)
        new = dataclasses.replace(run, lease_expires=lease_expires)
        self._put(new)
        return new

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        if (
            not self._mark.settled
            and (found := self._guard()) is not None
            and update_carries_payload(update)
        ):
            raise refuse(found, f"commit a payload to run {run_id!r}")
        run = self._get(run_id)
        check_commit(run, owner, now, update)
        _limits.check_update(update, self.max_payload_bytes)
        succ = update.successor
        if succ is not None and succ.run.id in self._d.runs:
            raise ConflictError(f"the successor id {succ.run.id!r} of run {run_id!r} is taken")
        inbox = self._d.inbox.get(run_id, [])
        if update.consume_signal is not None:
            idx = next((i for i, s in enumerate(inbox) if s.id == update.consume_signal), None)
            if idx is None:
                raise ConflictError(f"signal #{update.consume_signal} already consumed")
            inbox.pop(idx)
        new = apply_update(run, update, now, inbox_names={s.name for s in inbox})
        self._put(new)
        seqs = self._append(run_id, update.events)
        woken: list[str] = []
        handed: list[HandOff] = []
        if succ is not None:  # (continue-as-new: base.ContinuesAsNew)
            nxt = dataclasses.replace(succ.run, namespace=run.namespace, search=new.search)
            self._put(nxt)
            self._append(nxt.id, succ.events)
            # the signals and updates it had not taken go on to the successor, in order
            moved = [sig for sig in inbox if moves_to_successor(sig.name)]
            if moved:
                inbox[:] = [sig for sig in inbox if not moves_to_successor(sig.name)]
                self._d.inbox[nxt.id] = moved + self._d.inbox.get(nxt.id, [])
            if nxt.lease_owner is not None:
                handed.append(HandOff(nxt, tuple(self._d.events[nxt.id])))
        if update.notify is not None:
            n = update.notify
            for w, admitted in plan_release(self._deciding(n.workflow, n.tag, n.limit), n, now):
                if admitted is not None:
                    self._put(admitted)
                    self._append(w.id, [admitted_event(n.tag, now)])
                    handed.append(HandOff(admitted, tuple(self._d.events.get(w.id, ()))))
                    continue
                if w.status is RunStatus.SUSPENDED:
                    self._put(dataclasses.replace(w, wake_at=now))
                woken.append(w.id)
            self._arm_heads(n.workflow, n.tag, n.limit, now + _sg.HEAD_RECHECK)
        return CommitResult(new, seqs, tuple(woken), tuple(handed))

    async def append_events(
        self, run_id: str, owner: str, now: float, events: Sequence[Event]
    ) -> tuple[int, ...] | None:
        if (
            not self._mark.settled
            and (found := self._guard()) is not None
            and events_carry_payload(events)
        ):
            raise refuse(found, f"append a payload to run {run_id!r}")
        run = self._d.runs.get(run_id)
        if (
            run is None
            or not self._visible(run)
            or run.lease_owner != owner
            or run.status is not RunStatus.RUNNING
            or not events
            or upserts(events)  # (the search map changes: ``commit`` applies it)
        ):
            return None
        _limits.check_events(events, self.max_payload_bytes)
        if now > run.updated_at:  # (status and tags unchanged: no index to maintain)
            self._d.runs[run_id] = dataclasses.replace(run, updated_at=now)
        return self._append(run_id, events)

    async def due_runs(
        self,
        now: float,
        limit: int,
        workflows: Sequence[str] | None = None,
        *,
        versions: WorkflowVersions | None = None,
    ) -> list[str]:
        pairs = None if versions is None else set(versions)
        due = [
            r
            for r in (self._d.runs[i] for i in self._d.active)
            if self._visible(r)
            and (workflows is None or r.workflow in workflows)
            and (pairs is None or (r.workflow, r.workflow_version) in pairs)
        ]
        due = [r for r in due if claimable(r, now)]
        due.sort(key=lambda r: (due_time(r) or 0.0, r.created_at, r.id))
        return [r.id for r in due[:limit]]

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        return self._next_due(None, exclude_lease_owners)

    async def next_due_after(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None:
        return self._next_due(now, exclude_lease_owners)

    def _next_due(self, after: float | None, exclude_lease_owners: Sequence[str]) -> float | None:
        best: float | None = None
        for rid in self._d.active:
            r = self._d.runs[rid]
            if not self._visible(r) or (r.lease_owner in exclude_lease_owners and r.lease_owner):
                continue
            t = due_time(r)
            if t is not None and (after is None or t > after) and (best is None or t < best):
                best = t
        return best

    async def record_worker(self, instance_id: str, versions: WorkflowVersions, now: float) -> None:
        pairs = tuple(sorted((str(w), str(v)) for w, v in versions))
        seen = WorkerSeen(instance_id, pairs, now, self.namespace)
        self._d.workers[(self.namespace, instance_id)] = seen

    async def workers(self) -> list[WorkerSeen]:
        return sorted(
            # (unscoped: the workers of every namespace, as it sees every namespace's runs)
            (
                w
                for (ns, _), w in self._d.workers.items()
                if self.namespace is None or ns == self.namespace
            ),
            key=lambda w: w.instance_id,
        )

    async def put_workflow_schemas(self, schemas: Mapping[tuple[str, str], Any]) -> None:
        for doc in schemas.values():  # (all checked before any is kept)
            _limits.check_json("a workflow schema", doc, self.max_payload_bytes)
        for (workflow, version), doc in schemas.items():
            self._d.schemas[(self.namespace or "", workflow, version)] = copy.deepcopy(doc)

    async def workflow_schema(
        self, workflow: str, version: str, namespace: str | None = None
    ) -> Any | None:
        own = namespace if self.namespace is None else self.namespace  # (the run's)
        for ns in dict.fromkeys((own or "", "")):
            doc = self._d.schemas.get((ns, workflow, version))
            if doc is not None:
                return copy.deepcopy(doc)
        return None

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        if not self._mark.settled and (found := self._guard()) is not None and payload is not None:
            raise refuse(found, f"deliver signal {name!r} with a payload to run {run_id!r}")
        _limits.check_signal(name, payload, self.max_payload_bytes)
        run = self._get(run_id)
        while run.status.terminal and run.continued_as is not None and moves_to_successor(name):
            nxt = self._d.runs.get(run.continued_as)
            if nxt is None or not self._visible(nxt):
                break  # (pruned: the signal stays with the last run there is)
            run = nxt
        sig = InboxSignal(next(self._d.signal_ids), name, payload)
        self._d.inbox.setdefault(run.id, []).append(sig)
        if run.status is RunStatus.SUSPENDED and name in run.waiting_signals:
            run = dataclasses.replace(run, wake_at=now, updated_at=now)
            self._put(run)
        return run

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        return next((s for s in self._d.inbox.get(run_id, ()) if s.name == name), None)

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: AdmittedAt = None,
        recheck: bool = False,
    ) -> bool:
        _sg.check_limit(limit)  # (before anything: a limit of 0 would park the run for ever)
        run = self._get(run_id)
        runs = self._deciding(workflow, tag, limit, run)
        tags = _sg.admission_tags(runs, run_id, tag, workflow, limit)
        if tags is not None:
            if list(run.tags) != tags:
                self._put(dataclasses.replace(run, tags=tuple(tags)))
                at = admission_time(admitted_at)
                if at is not None and ADMITTED_TAG not in run.tags:
                    self._append(run_id, [admitted_event(tag, at)])
                if retry_wake_at is not None:  # the waiter behind it is a head now
                    self._arm_heads(workflow, tag, limit, retry_wake_at)
            return True
        # (a re-check behind the heads parks without a timer; a first denial keeps one)
        heads = limit if recheck else None
        patch = _sg.denial_patch(runs, run_id, tag, workflow, retry_wake_at, heads)
        if patch:
            self._put(dataclasses.replace(run, **patch))
            if retry_wake_at is not None:
                self._arm_heads(workflow, tag, limit, retry_wake_at)
        return False

    def _arm_heads(self, workflow: str, tag: str, limit: int | None, at: float) -> None:
        """Give the key's head waiters that hold no timer a re-check at ``at``
        (``singleton.heads_to_arm``): the waiters behind them hold none."""
        runs = self._deciding(workflow, tag, limit)
        for rid in _sg.heads_to_arm(runs, tag, workflow, limit, at):
            self._put(dataclasses.replace(self._d.runs[rid], wake_at=at))


__all__ = ["MemoryStore"]
