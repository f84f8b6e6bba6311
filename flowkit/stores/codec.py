"""``CodecStore``: payload encoding (encryption) in front of any store.

``CodecStore(inner, codec)`` encodes every payload (run inputs, outputs and error messages,
the payloads of events and signals) before it reaches ``inner`` and decodes it on the way out;
what the store queries on stays in clear. Encoded values stay JSON values (a string field
holds ``"$codec:" + <compact JSON>``). ``AESGCMCodec`` encrypts with AES-GCM and rotates keys.
Which fields, and how: docs/stores.md, "CodecStore: encrypting payloads"."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import orjson

from .._run import Run, RunStatus
from ..errors import CodecError
from ..events import (
    ErrorInfo,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    SignalReceived,
    StepCompleted,
    StepFailed,
)
from .base import (
    UNSET,
    Admission,
    AdmittedAt,
    CommitResult,
    HandOff,
    InboxSignal,
    QueueCap,
    Update,
    records_admission,
)
from .limits import check_json, payload_limit

STRING_PREFIX = "$codec:"
"""Marks an encoded value stored in a string-typed field (error messages)."""

_ERROR_TEXT_FIELDS = ("message", "cause_message")


log = logging.getLogger("flowkit")


@runtime_checkable
class Codec(Protocol):
    """Turns a JSON value into another JSON value and back: ``decode(encode(v)) == v``."""

    def encode(self, value: Any) -> Any:
        """The stored form of the JSON value ``value`` (itself a JSON value)."""
        ...

    def decode(self, value: Any) -> Any:
        """The original JSON value of a stored form; ``CodecError`` when it cannot."""
        ...


# -- AES-GCM ------------------------------------------------------------------------------


class AESGCMCodec:
    """AES-GCM with key ids and rotation.

    ``keys`` maps key ids to 16, 24 or 32 byte keys (AES-128/192/256), oldest first: a
    ``Mapping`` (insertion order) or a sequence of ``(key_id, key)`` pairs. Values are encrypted
    with the *last* key and decrypted with whichever key their envelope names, so rotating is:
    append a new key, deploy, and drop an old key only once nothing encrypted with it is read
    any more. Each value is stored as
    ``{"$codec": "aesgcm", "kid": <key id>, "data": <base64 of nonce + ciphertext + tag>}`` with
    a fresh random 12-byte nonce; the key id is bound as associated data.

    ``accept_plaintext=True`` reads values that are not envelopes as they are (for wrapping a
    store that already holds plaintext payloads); by default they raise ``CodecError``."""

    NAME = "aesgcm"
    NONCE_SIZE = 12
    KEY_SIZES = (16, 24, 32)

    def __init__(
        self,
        keys: Mapping[str, bytes] | Sequence[tuple[str, bytes]],
        *,
        accept_plaintext: bool = False,
    ) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ImportError(
                "AESGCMCodec needs the 'cryptography' package (pip install 'flowkit[crypto]')"
            ) from exc
        pairs = list(keys.items()) if isinstance(keys, Mapping) else list(keys)
        if not pairs:
            raise ValueError("AESGCMCodec needs at least one key")
        self._keys: dict[str, Any] = {}
        for pair in pairs:
            if isinstance(pair, str | bytes) or len(pair) != 2:
                raise ValueError("keys must be a mapping or a sequence of (key_id, key) pairs")
            kid, key = pair
            if not isinstance(kid, str) or not kid:
                raise ValueError(f"a key id must be a non-empty str, got {kid!r}")
            if kid in self._keys:
                raise ValueError(f"duplicate key id {kid!r}")
            if not isinstance(key, bytes | bytearray) or len(key) not in self.KEY_SIZES:
                size = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
                raise ValueError(
                    f"key {kid!r} must be 16, 24 or 32 bytes (AES-128/192/256), got {size}"
                )
            self._keys[kid] = AESGCM(bytes(key))
        self.current_key_id: str = pairs[-1][0]
        self.accept_plaintext = accept_plaintext

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The key ids this codec can decrypt with, oldest first."""
        return tuple(self._keys)

    def __repr__(self) -> str:  # never shows key material
        return f"AESGCMCodec(key_ids={list(self._keys)!r}, current={self.current_key_id!r})"

    @staticmethod
    def _aad(kid: str) -> bytes:
        return b"flowkit.codec.aesgcm/1:" + kid.encode()

    def encode(self, value: Any) -> Any:
        kid = self.current_key_id
        plaintext = orjson.dumps(value)
        # A fresh random nonce per value. os.urandom is deliberate: this is cryptographic
        # material, not engine scheduling randomness (which comes from the injected RNG), and
        # it never influences replay: decoding returns the same value whatever the nonce.
        nonce = os.urandom(self.NONCE_SIZE)
        sealed = self._keys[kid].encrypt(nonce, plaintext, self._aad(kid))
        return {
            "$codec": self.NAME,
            "kid": kid,
            "data": base64.b64encode(nonce + sealed).decode("ascii"),
        }

    def decode(self, value: Any) -> Any:
        if not (isinstance(value, dict) and value.get("$codec") == self.NAME):
            if self.accept_plaintext:
                return value
            raise CodecError(
                f"stored payload is not AES-GCM encoded ({type(value).__name__}); pass "
                "accept_plaintext=True to read payloads written without the codec"
            )
        kid = value.get("kid")
        data = value.get("data")
        if not isinstance(kid, str) or not isinstance(data, str):
            raise CodecError("malformed AES-GCM envelope (kid/data missing)")
        aead = self._keys.get(kid)
        if aead is None:
            raise CodecError(
                f"payload was encrypted with key id {kid!r}, which this codec does not have "
                f"(known key ids: {', '.join(map(repr, self._keys))})",
                key_id=kid,
            )
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.b64decode(data, validate=True)
            if len(raw) < self.NONCE_SIZE + 16:
                raise ValueError("too short")
            plaintext = aead.decrypt(raw[: self.NONCE_SIZE], raw[self.NONCE_SIZE :], self._aad(kid))
        except (InvalidTag, ValueError, binascii.Error):
            raise CodecError(
                f"payload encrypted with key id {kid!r} failed authentication: it was "
                "tampered with or corrupted",
                key_id=kid,
            ) from None
        try:
            return orjson.loads(plaintext)
        except orjson.JSONDecodeError as exc:  # authenticated, so only a foreign writer
            raise CodecError(f"decrypted payload is not JSON: {exc}", key_id=kid) from None


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


class CodecStore:
    """A store that encodes payloads with ``codec`` before they reach ``inner`` (module doc).

    ``try_admit_singleton``, ``scoped``, ``watch`` and ``next_due_after`` exist only when
    ``inner`` has them (not ``None``): the engine refuses singleton workflows
    (``UnsupportedStoreError``) on a store without admission, and a ``CodecStore`` must not
    pretend otherwise. ``watch`` (wake-ups carry no payload) and ``next_due_after`` (an
    instant) are ``inner``'s own. Likewise ``admits_on_create`` is true only when
    ``inner``'s is: ``create_run`` then forwards an ``Admission`` (its gated events encoded
    like every other event), and ``appends_events`` only when ``inner``'s is:
    ``append_events`` then forwards a step's record, its events encoded as ``commit`` encodes
    ``Update.events``. Either, called on a wrapper whose ``inner`` lacks the capability,
    raises ``TypeError`` and sends nothing. ``records_admission`` (``singleton_admitted``
    written with the marker) and ``release_leases`` are ``inner``'s too."""

    try_admit_singleton: _AdmitFn
    scoped: _ScopedFn
    watch: _WatchFn
    next_due_after: _NextDueAfterFn
    admits_on_create: bool = False
    appends_events: bool = False
    records_admission: bool = False

    def __init__(self, inner: Any, codec: Codec) -> None:
        if not (
            callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))
        ):
            raise TypeError(f"codec must have encode() and decode(), got {codec!r}")
        self.inner = inner
        self.codec = codec
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
        if getattr(inner, "admits_on_create", False):
            self.admits_on_create = True
        if getattr(inner, "appends_events", False):
            self.appends_events = True
        if records_admission(inner):
            self.records_admission = True

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
    ) -> bool:
        # no payload is read or written: the key and tags are in clear
        if admitted_at is None:
            return bool(
                await self.inner.try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at)
            )
        return bool(
            await self.inner.try_admit_singleton(
                run_id, tag, workflow, limit, retry_wake_at, admitted_at=admitted_at
            )
        )

    # -- value encoding -------------------------------------------------------------------
    def _enc(self, value: Any) -> Any:
        check_json("a payload", value, payload_limit(self))  # (docs/stores.md, "Limits")
        return None if value is None else self.codec.encode(value)

    def _dec(self, value: Any) -> Any:
        return None if value is None else self.codec.decode(value)

    def _enc_text(self, value: Any) -> Any:
        if value is None:
            return None
        return STRING_PREFIX + orjson.dumps(self.codec.encode(value)).decode()

    def _dec_text(self, value: Any) -> Any:
        if isinstance(value, str) and value.startswith(STRING_PREFIX):
            try:
                stored = orjson.loads(value[len(STRING_PREFIX) :])
            except orjson.JSONDecodeError:
                raise CodecError("corrupt encoded string payload") from None
            return self.codec.decode(stored)
        return self._dec(value)  # not encoded: the codec decides (plaintext or error)

    @staticmethod
    def _map_error(error: Any, text: Callable[[Any], Any]) -> Any:
        """Apply ``text`` to the free-text fields of a run's error (type names stay clear)."""
        if error is None:
            return None
        if not isinstance(error, dict):
            return text(error)
        out = dict(error)
        for k in _ERROR_TEXT_FIELDS:
            if k in out:
                out[k] = text(out[k])
        return out

    def _enc_error(self, error: Any) -> Any:
        return self._map_error(error, self._enc_text)

    def _dec_error(self, error: Any) -> Any:
        return self._map_error(error, self._dec_text)

    def _enc_info(self, info: ErrorInfo) -> ErrorInfo:
        return info.model_copy(
            update={
                "message": self._enc_text(info.message),
                "cause_message": self._enc_text(info.cause_message),
            }
        )

    def _dec_info(self, info: ErrorInfo) -> ErrorInfo:
        message = self._dec_text(info.message)
        cause = self._dec_text(info.cause_message)
        if not isinstance(message, str) or not (cause is None or isinstance(cause, str)):
            raise CodecError("decoded error message is not a string")
        return info.model_copy(update={"message": message, "cause_message": cause})

    def _run_out(self, run: Run) -> Run:
        return dataclasses.replace(
            run,
            input=self._dec(run.input),
            output=self._dec(run.output),
            error=self._dec_error(run.error),
        )

    def _run_in(self, run: Run) -> Run:
        return dataclasses.replace(
            run,
            input=self._enc(run.input),
            output=self._enc(run.output),
            error=self._enc_error(run.error),
        )

    def _maybe_run_out(self, run: Run | None) -> Run | None:
        return None if run is None else self._run_out(run)

    @staticmethod
    def _map_event(
        ev: Event, value: Callable[[Any], Any], info: Callable[[ErrorInfo], ErrorInfo]
    ) -> Event:
        """Apply ``value`` to the event's payload field (``info`` to its error), if any."""
        if isinstance(ev, RunStarted):
            return ev.model_copy(update={"input": value(ev.input)})
        if isinstance(ev, StepCompleted):
            return ev.model_copy(update={"result": value(ev.result)})
        if isinstance(ev, SignalReceived):
            return ev.model_copy(update={"payload": value(ev.payload)})
        if isinstance(ev, RunCompleted):
            return ev.model_copy(update={"output": value(ev.output)})
        if isinstance(ev, StepFailed | RunFailed):
            return ev.model_copy(update={"error": info(ev.error)})
        return ev

    def _event_in(self, ev: Event) -> Event:
        return self._map_event(ev, self._enc, self._enc_info)

    def _event_out(self, ev: Event) -> Event:
        return self._map_event(ev, self._dec, self._dec_info)

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
            gated = tuple(self._event_in(e) for e in admission.gated)
            admitted = tuple(self._event_in(e) for e in admission.admitted)
            extra["admission"] = dataclasses.replace(admission, gated=gated, admitted=admitted)
        stored, created = await self.inner.create_run(
            self._run_in(run), [self._event_in(e) for e in events], queue_cap=queue_cap, **extra
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
    ) -> list[Run]:
        found = await self.inner.list_runs(workflow=workflow, status=status, tag=tag, limit=limit)
        return [self._run_out(r) for r in found]

    async def load_events(self, run_id: str) -> list[Event]:
        return [self._event_out(e) for e in await self.inner.load_events(run_id)]

    async def claim(self, run_id: str, owner: str, now: float, lease_expires: float) -> Run | None:
        return self._maybe_run_out(await self.inner.claim(run_id, owner, now, lease_expires))

    async def release_leases(self, owner: str, now: float) -> list[str]:
        released: list[str] = await self.inner.release_leases(owner, now)
        return released

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        return self._maybe_run_out(await self.inner.renew_lease(run_id, owner, lease_expires))

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        encoded = dataclasses.replace(
            update,
            events=[self._event_in(e) for e in update.events],
            output=update.output if update.output is UNSET else self._enc(update.output),
            error=update.error if update.error is UNSET else self._enc_error(update.error),
        )
        res: CommitResult = await self.inner.commit(run_id, owner, now, encoded)
        handed: list[HandOff] = []
        for h in res.handed:  # committed already: a waiter we cannot decode is not our error
            try:
                handed.append(
                    HandOff(self._run_out(h.run), tuple(self._event_out(e) for e in h.events))
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
            run_id, owner, now, [self._event_in(e) for e in events]
        )
        return None if seqs is None else tuple(seqs)

    async def due_runs(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[str]:
        return list(await self.inner.due_runs(now, limit, workflows))

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        due: float | None = await self.inner.next_due_at(exclude_lease_owners)
        return due

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        run = await self.inner.deliver_signal(run_id, name, self._enc(payload), now)
        return self._run_out(run)

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        sig = await self.inner.peek_signal(run_id, name)
        if sig is None:
            return None
        return InboxSignal(sig.id, sig.name, self._dec(sig.payload))


__all__ = ["STRING_PREFIX", "AESGCMCodec", "Codec", "CodecError", "CodecStore"]
