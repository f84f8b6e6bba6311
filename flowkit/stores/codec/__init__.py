"""``CodecStore``: payload encoding (encryption) in front of any store.

``CodecStore(inner, codec)`` encodes every payload (run inputs, outputs and error messages,
the payloads of events and signals) before it reaches ``inner`` and decodes it on the way out;
what the store queries on stays in clear. Encoded values stay JSON values (a string field
holds ``"$codec:" + <compact JSON>``). ``AESGCMCodec`` encrypts with AES-GCM and rotates keys;
each value is bound to its run and field (the codec's ``context``), a step's arguments' digest
is encrypted too, and the inner store is told that its writes come through here
(``bind_codec``: the encryption marker). Which fields, and how: docs/stores.md, "CodecStore:
encrypting payloads"."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import orjson as _json

from ..._core.run import Run, RunStatus
from ..._core.search_terms import Term
from ...errors import CodecError, EncryptedStoreError
from ...events import Event
from ..base import (
    UNSET,
    Admission,
    AdmittedAt,
    CommitResult,
    GateCheck,
    HandOff,
    InboxSignal,
    PublishedEvent,
    QueueCap,
    Successor,
    TakenEvent,
    Update,
    WorkerSeen,
    WorkflowVersions,
    claims_by_version,
    claims_gated,
    continues_as_new,
    prunes_runs,
    publishes_events,
    rechecks_heads,
    records_admission,
    records_schemas,
    records_workers,
)
from ..schedules import keeps_schedules
from ._aesgcm import AESGCMCodec
from ._browse import forward_browse
from ._fields import STRING_PREFIX, CodecFields, inbox_context, older_inbox_contexts
from ._schedules import CodecSchedules

log = logging.getLogger("flowkit")


@runtime_checkable
class Codec(Protocol):
    """Turns a JSON value into another JSON value and back: ``decode(encode(v)) == v``.

    Optional: ``binds_context = True`` and a keyword ``context`` (a tuple of str: the run id,
    then the field) on both methods: ``CodecStore`` then passes each value's place, and a
    value decoded with another context than it was encoded with should raise ``CodecError``
    (``AESGCMCodec`` binds it as associated data). ``marker``: a short str describing the
    codec (no secret), recorded in the store's metadata (see ``CodecStore``).
    ``keyed_digest(data: bytes) -> str``: a keyed digest (a MAC: equal data, equal digests,
    and none computable without the codec's secret); ``CodecStore`` then keys the digests of
    published events' values and waiters' ``match`` with it (``AESGCMCodec`` has it). Without
    it those digests are stored as the engine makes them: unkeyed SHA-256, which whoever reads
    the database can check guessed values against."""

    def encode(self, value: Any) -> Any:
        """The stored form of the JSON value ``value`` (itself a JSON value)."""
        ...

    def decode(self, value: Any) -> Any:
        """The original JSON value of a stored form; ``CodecError`` when it cannot."""
        ...


def _schema_ctx(workflow: str, version: str) -> tuple[str, ...]:
    """The codec context of a workflow version's schemas (no run: the place of a run id)."""
    return ("workflow-schema", workflow, version)


# -- the store wrapper ----------------------------------------------------------------------


class _AdmitFn(Protocol):
    def __call__(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: AdmittedAt = None,
    ) -> Coroutine[Any, Any, bool]: ...


class _ScopedFn(Protocol):
    def __call__(self, namespace: str) -> CodecStore: ...


class _WatchFn(Protocol):
    def __call__(self, callback: Callable[[], None]) -> Callable[[], None]: ...


class _NextDueAfterFn(Protocol):
    async def __call__(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None: ...


class CodecStore(CodecFields, CodecSchedules):
    """A store that encodes payloads with ``codec`` before they reach ``inner`` (module doc).

    ``try_admit_singleton``, ``scoped``, ``watch`` and ``next_due_after`` exist only when
    ``inner`` has them (not ``None``): the engine refuses singleton workflows
    (``UnsupportedStoreError``) on a store without admission, and a ``CodecStore`` must not
    pretend otherwise. ``watch`` (wake-ups carry no payload) and ``next_due_after`` (an
    instant) are ``inner``'s own. Likewise ``admits_on_create`` is true only when
    ``inner``'s is: ``create_run`` then forwards an ``Admission`` (its gated events encoded
    like every other event), and ``appends_events`` only when ``inner``'s is:
    ``append_events`` then forwards a step's record, its events encoded as ``commit`` encodes
    ``Update.events``. ``claims_by_version`` (``claim``/``due_runs`` with ``versions``) and
    ``records_workers`` (no payload either) and ``claims_gated`` (``claim`` with ``gate``: a denied
    waiter comes back as it is, without payloads) are forwarded likewise, and ``continues_as_new``
    (``Update.successor``'s run and events encoded as a new run's), and ``publishes_events``
    (``publish_event``'s payload encoded, at rest in the buffer too; ``take_event``'s decoded;
    the digests of ``keys`` and ``match`` keyed with the codec's ``keyed_digest`` when it has
    one, else passed as they are). Any of these, called on a
    wrapper whose ``inner`` lacks the capability, raises ``TypeError`` and sends nothing.
    ``records_admission`` (``singleton_admitted`` written with the marker) and
    ``release_leases`` are ``inner``'s too. ``keeps_schedules`` (``engine.schedules``) is
    forwarded likewise, each schedule's input encoded (``_codec_schedules``), and
    ``records_schemas``, each workflow version's schema document encoded like a payload.

    When ``inner`` has ``bind_codec`` (``MemoryStore``, ``SqlStore``), the wrapper calls
    ``inner.bind_codec(marker)`` at construction: writes through that store object come
    encoded, and it records ``marker`` (the codec's ``marker``, else its class name) in its
    metadata on its first write. A store object no ``CodecStore`` bound then refuses to write
    payloads in clear to that database (``EncryptedStoreError``)."""

    try_admit_singleton: _AdmitFn
    scoped: _ScopedFn
    watch: _WatchFn
    next_due_after: _NextDueAfterFn
    admits_on_create: bool = False
    appends_events: bool = False
    records_admission: bool = False
    claims_by_version: bool = False
    claims_gated: bool = False
    records_workers: bool = False
    records_schemas: bool = False
    continues_as_new: bool = False
    keeps_schedules: bool = False
    publishes_events: bool = False

    def __init__(self, inner: Any, codec: Codec) -> None:
        if not (
            callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))
        ):
            raise TypeError(f"codec must have encode() and decode(), got {codec!r}")
        self.inner = inner
        self.codec = codec
        self._binds = bool(getattr(codec, "binds_context", False))
        mac = getattr(codec, "keyed_digest", None)
        self._mac: Callable[[bytes], str] | None = mac if callable(mac) else None
        marker = getattr(codec, "marker", None)
        self.marker: str = (
            marker if isinstance(marker, str) and marker else type(codec).__qualname__
        )
        bind = getattr(inner, "bind_codec", None)
        if callable(bind):
            bind(self.marker)
        if getattr(inner, "try_admit_singleton", None) is not None:
            self.try_admit_singleton = self._try_admit_singleton
        if getattr(inner, "scoped", None) is not None:
            self.scoped = self._scoped
        if getattr(inner, "watch", None) is not None:
            self.watch = self._watch
        if getattr(inner, "release_leases", None) is None:
            self.release_leases = None  # type: ignore[assignment,method-assign]
        if getattr(inner, "next_due_after", None) is not None:
            self.next_due_after = self._next_due_after
        if prunes_runs(inner):
            self.prune_runs = self._prune_runs
        if getattr(inner, "admits_on_create", False):
            self.admits_on_create = True
        if getattr(inner, "appends_events", False):
            self.appends_events = True
        if records_admission(inner):
            self.records_admission = True
        if claims_by_version(inner):
            self.claims_by_version = True
        if claims_gated(inner):
            self.claims_gated = True
        if records_workers(inner):
            self.records_workers = True
        if records_schemas(inner):
            self.records_schemas = True
        if continues_as_new(inner):
            self.continues_as_new = True
        if keeps_schedules(inner):
            self.keeps_schedules = True
        if publishes_events(inner):
            self.publishes_events = True
        forward_browse(self, inner)

    def _watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        unwatch: Callable[[], None] = self.inner.watch(callback)
        return unwatch

    async def _next_due_after(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None:
        due: float | None = await self.inner.next_due_after(now, exclude_lease_owners)
        return due

    def __repr__(self) -> str:
        return f"CodecStore({self.inner!r}, {self.codec!r})"

    @property
    def namespace(self) -> str | None:
        ns = getattr(self.inner, "namespace", None)
        return ns if isinstance(ns, str) else None

    async def codec_marker(self) -> str | None:
        """The marker ``inner`` holds (``None`` when none is recorded yet or it keeps none)."""
        read = getattr(self.inner, "codec_marker", None)
        return None if read is None else cast("str | None", await read())

    def close(self) -> None:
        """Close ``inner`` when it can be closed (``SqlStore.close``)."""
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()

    def _scoped(self, namespace: str) -> CodecStore:
        return CodecStore(self.inner.scoped(namespace), self.codec)

    async def _try_admit_singleton(
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
        # no payload is read or written: the key and tags are in clear
        if admitted_at is None and not recheck:
            return bool(
                await self.inner.try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at)
            )
        kw: dict[str, Any] = {"admitted_at": admitted_at} if admitted_at is not None else {}
        if recheck and rechecks_heads(self.inner):
            kw["recheck"] = True
        return bool(
            await self.inner.try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at, **kw)
        )

    # -- the contract (see flowkit.stores.base.Store) --------------------------------------
    async def create_run(
        self,
        run: Run,
        events: Sequence[Event],
        *,
        queue_cap: QueueCap | None = None,
        admission: Admission | None = None,
    ) -> tuple[Run, bool]:
        extra: dict[str, Any] = {}
        if admission is not None:  # only to an inner store that takes it
            if not self.admits_on_create:
                raise TypeError(f"{self.inner!r} does not admit on create (admits_on_create)")
            gated = tuple(self._event_in(e, run.id) for e in admission.gated)
            admitted = tuple(self._event_in(e, run.id) for e in admission.admitted)
            extra["admission"] = dataclasses.replace(admission, gated=gated, admitted=admitted)
        stored, created = await self.inner.create_run(
            self._run_in(run),
            [self._event_in(e, run.id) for e in events],
            queue_cap=queue_cap,
            **extra,
        )
        return self._run_out(stored), bool(created)

    async def get_run(self, run_id: str) -> Run | None:
        return self._maybe_run_out(await self.inner.get_run(run_id))

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
        # (search attributes are kept in clear: the store indexes them; only what is given
        # is passed on, for an inner store that takes less)
        more: dict[str, Any] = {}
        if parent_id is not None:
            more["parent_id"] = parent_id
        if search:
            more["search"] = search
        if after is not None:
            more["after"] = after
        found = await self.inner.list_runs(
            workflow=workflow, status=status, tag=tag, limit=limit, **more
        )
        return [self._run_out(r) for r in found]

    async def _prune_runs(
        self,
        settled_before: float,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        limit: int = 500,
    ) -> int:
        n: int = await self.inner.prune_runs(
            settled_before, workflow=workflow, status=status, limit=limit
        )
        return n

    async def load_events(self, run_id: str) -> list[Event]:
        return [self._event_out(e, run_id) for e in await self.inner.load_events(run_id)]

    async def latest_event(self, run_id: str, type: str, field: str, value: str) -> Event | None:
        """``base.LatestEvent``: the wrapped store's (the event decoded), or a search of the
        decoded history when it has none. ``field`` must be one kept in clear (a key, an
        id: ``_codec_fields``), as the wrapped store compares it."""
        find = getattr(self.inner, "latest_event", None)
        if not callable(find):
            for ev in reversed(await self.load_events(run_id)):
                if ev.type == type and getattr(ev, field, None) == value:
                    return ev
            return None
        found = await find(run_id, type, field, value)
        return None if found is None else self._event_out(found, run_id)

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
        kw: dict[str, Any] = {}
        if versions is not None:
            if not self.claims_by_version:  # only to an inner store that has it
                raise TypeError(f"{self.inner!r} does not claim by version (claims_by_version)")
            kw["versions"] = versions
        if gate is not None:  # (the decision reads and writes no payload)
            if not self.claims_gated:
                raise TypeError(f"{self.inner!r} does not claim gated waiters (claims_gated)")
            kw["gate"] = gate
        got = await self.inner.claim(run_id, owner, now, lease_expires, **kw)
        if got is not None and got.lease_owner != owner:
            return cast(Run, got)  # (a denied waiter, parked: it carries no payloads)
        return self._maybe_run_out(got)

    async def release_leases(self, owner: str, now: float) -> list[str]:
        released: list[str] = await self.inner.release_leases(owner, now)
        return released

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        return self._maybe_run_out(await self.inner.renew_lease(run_id, owner, lease_expires))

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        ctx = (run_id,)
        encoded = dataclasses.replace(
            update,
            events=[self._event_in(e, run_id) for e in update.events],
            output=(
                update.output
                if update.output is UNSET
                else self._enc(update.output, (run_id, "output"))
            ),
            error=update.error if update.error is UNSET else self._enc_error(update.error, ctx),
            input=(
                update.input
                if update.input is UNSET
                else self._enc(update.input, (run_id, "input"))
            ),
        )
        succ = update.successor
        if succ is not None:  # (only to an inner store that has it; encoded as a new run's)
            if not self.continues_as_new:
                raise TypeError(f"{self.inner!r} does not continue as new (continues_as_new)")
            sid = succ.run.id
            encoded = dataclasses.replace(
                encoded,
                successor=Successor(
                    self._run_in(succ.run), tuple(self._event_in(e, sid) for e in succ.events)
                ),
            )
        res: CommitResult = await self.inner.commit(run_id, owner, now, encoded)
        handed: list[HandOff] = []
        for h in res.handed:  # committed already: a waiter we cannot decode is not our error
            try:
                handed.append(
                    HandOff(
                        self._run_out(h.run), tuple(self._event_out(e, h.run.id) for e in h.events)
                    )
                )
            except Exception:
                log.warning(
                    "cannot decode handed-over run %s; it is recovered when its lease expires",
                    h.run.id,
                    exc_info=True,
                )
        return dataclasses.replace(res, run=self._run_out(res.run), handed=tuple(handed))

    async def append_events(
        self, run_id: str, owner: str, now: float, events: Sequence[Event]
    ) -> tuple[int, ...] | None:
        if not self.appends_events:  # only to an inner store that has it
            raise TypeError(f"{self.inner!r} does not append events (appends_events)")
        seqs = await self.inner.append_events(
            run_id, owner, now, [self._event_in(e, run_id) for e in events]
        )
        return None if seqs is None else tuple(seqs)

    async def due_runs(
        self,
        now: float,
        limit: int,
        workflows: Sequence[str] | None = None,
        *,
        versions: WorkflowVersions | None = None,
    ) -> list[str]:
        if versions is None:
            return list(await self.inner.due_runs(now, limit, workflows))
        if not self.claims_by_version:
            raise TypeError(f"{self.inner!r} does not claim by version (claims_by_version)")
        return list(await self.inner.due_runs(now, limit, workflows, versions=versions))

    async def record_worker(self, instance_id: str, versions: WorkflowVersions, now: float) -> None:
        """``inner``'s (no payload: names and versions); ``TypeError`` without the capability."""
        if not self.records_workers:
            raise TypeError(f"{self.inner!r} does not record workers (records_workers)")
        await self.inner.record_worker(instance_id, versions, now)

    async def workers(self) -> list[WorkerSeen]:
        """``inner``'s; ``TypeError`` without the capability."""
        if not self.records_workers:
            raise TypeError(f"{self.inner!r} does not record workers (records_workers)")
        return list(await self.inner.workers())

    async def put_workflow_schemas(self, schemas: Mapping[tuple[str, str], Any]) -> None:
        """``inner``'s, each document encoded like a payload (a schema's defaults, examples and
        descriptions may hold values); ``TypeError`` without the capability."""
        if not self.records_schemas:
            raise TypeError(f"{self.inner!r} does not record schemas (records_schemas)")
        encoded = {(w, v): self._enc(doc, _schema_ctx(w, v)) for (w, v), doc in schemas.items()}
        await self.inner.put_workflow_schemas(encoded)

    async def workflow_schema(
        self, workflow: str, version: str, namespace: str | None = None
    ) -> Any | None:
        """``inner``'s, decoded; ``TypeError`` without the capability."""
        if not self.records_schemas:
            raise TypeError(f"{self.inner!r} does not record schemas (records_schemas)")
        doc = await self.inner.workflow_schema(workflow, version, namespace)
        return self._dec(doc, _schema_ctx(workflow, version))

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        due: float | None = await self.inner.next_due_at(exclude_lease_owners)
        return due

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        encoded = self._enc(payload, inbox_context(run_id, name))
        run = await self.inner.deliver_signal(run_id, name, encoded, now)
        return self._run_out(run)

    async def publish_event(
        self, name: str, payload: Any, event_id: str, keys: dict[str, str], now: float
    ) -> PublishedEvent:
        """``inner``'s, the payload encoded (bound to the event, not to a run: it may go to
        many; buffered, it stays encoded at rest). ``keys`` are digests already
        (``PublishesEvents``). ``TypeError`` without the capability."""
        if not self.publishes_events:
            raise TypeError(f"{self.inner!r} has no published events (publishes_events)")
        encoded = self._enc(payload, ("event", name, event_id, "payload"))
        keyed = self._key_digests(name, keys)
        done: PublishedEvent = await self.inner.publish_event(name, encoded, event_id, keyed, now)
        return done

    def _key_digests(self, name: str, digests: dict[str, str]) -> dict[str, str]:
        """An event's ``keys`` or a waiter's ``match`` (digests of JSON values), keyed with the
        codec's ``keyed_digest`` (each bound to the event name and the top-level key), so the
        store holds digests nobody can check guessed values against without the codec's
        secret; as they are when the codec has no ``keyed_digest``. Both sides of a match pass
        here, so equal values still give equal digests."""
        mac = self._mac
        if mac is None:
            return digests
        try:
            return {
                k: mac(_json.dumps(["flowkit.event-key/1", name, k, d])) for k, d in digests.items()
            }
        except Exception as exc:  # a custom codec's own failure: one typed error
            raise CodecError(f"keyed_digest of event {name!r} failed: {exc}") from exc

    async def take_event(
        self,
        run_id: str,
        pos: str,
        name: str,
        match: dict[str, str],
        now: float,
        *,
        wait: bool = True,
    ) -> TakenEvent | None:
        """``inner``'s, the payload decoded. ``TypeError`` without the capability."""
        if not self.publishes_events:
            raise TypeError(f"{self.inner!r} has no published events (publishes_events)")
        keyed = self._key_digests(name, match)
        got = await self.inner.take_event(run_id, pos, name, keyed, now, wait=wait)
        if got is None:
            return None
        ctx = ("event", name, got.event_id, "payload")
        return TakenEvent(got.event_id, self._dec(got.payload, ctx), got.mark)

    async def drop_event_wait(
        self, run_id: str, pos: str, name: str, now: float
    ) -> tuple[str, ...]:
        """``inner``'s (the event it offers again moves encoded, with its keyed digests: it is
        bound to the event, not to a run). ``TypeError`` without the capability."""
        if not self.publishes_events:
            raise TypeError(f"{self.inner!r} has no published events (publishes_events)")
        again: tuple[str, ...] = await self.inner.drop_event_wait(run_id, pos, name, now)
        return again

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        sig = await self.inner.peek_signal(run_id, name)
        if sig is None:
            return None
        try:
            payload = self._dec(sig.payload, inbox_context(run_id, sig.name))
        except CodecError as exc:
            # (delivered before inbox payloads were bound to their chain: bound to the run it
            # was sent to, this one or an earlier run of its chain that moved it on)
            for ctx in older_inbox_contexts(run_id, sig.name):
                try:
                    payload = self._dec(sig.payload, ctx)
                    break
                except CodecError:
                    continue
            else:
                raise exc from None
        return InboxSignal(sig.id, sig.name, payload)


__all__ = [
    "STRING_PREFIX",
    "AESGCMCodec",
    "Codec",
    "CodecError",
    "CodecStore",
    "EncryptedStoreError",
]
