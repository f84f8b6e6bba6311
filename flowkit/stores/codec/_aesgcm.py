"""``AESGCMCodec``: AES-GCM with key ids, rotation and envelopes bound to their place.

Envelope version 2 (written since issue #19) binds the key id *and a context* (the run id and
the field, given by ``CodecStore``) as associated data, so a ciphertext moved to another run
or another field fails authentication. Version 1 envelopes (no ``"v"``, the key id alone as
associated data) are still read unless ``accept_unbound=False``. See docs/stores.md,
"CodecStore: encrypting payloads"."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ...errors import CodecError

ENVELOPE_VERSION = 2
"""The version of the envelopes ``AESGCMCodec`` writes (``"v"`` in the envelope)."""

_TAG_SIZE = 16

DIGEST_KEY_LABEL = b"flowkit.codec.aesgcm/digest-key/1"
"""The fixed label the MAC key of ``AESGCMCodec.keyed_digest`` is derived with (HMAC-SHA256 of
it under the codec's first key): a key of its own, never used to encrypt."""


class AESGCMCodec:
    """AES-GCM with key ids and rotation.

    ``keys`` maps key ids to 16, 24 or 32 byte keys (AES-128/192/256), oldest first: a
    ``Mapping`` (insertion order) or a sequence of ``(key_id, key)`` pairs. Values are encrypted
    with the *last* key and decrypted with whichever key their envelope names, so rotating is:
    append a new key, deploy, and drop an old key only once nothing encrypted with it is read
    any more. Each value is stored as ``{"$codec": "aesgcm", "v": 2, "kid": <key id>,
    "data": <base64 of nonce + ciphertext + tag>}`` with a fresh random 12-byte nonce; the key
    id and the ``context`` (``CodecStore`` passes the run id and the field) are bound as
    associated data: decoding needs the same context.

    ``keyed_digest`` (what ``CodecStore`` matches published events on) is an HMAC-SHA256 under
    a MAC key derived from the *first* (oldest) key, so appending keys for rotation keeps the
    digests, and with them the matching of buffered events and registered waits; dropping the
    first key changes them (see ``keyed_digest``).

    ``accept_plaintext=True`` reads values that are not envelopes as they are (for wrapping a
    store that already holds plaintext payloads); by default they raise ``CodecError``.
    ``accept_unbound=False`` refuses version 1 envelopes (written before envelopes were bound
    to their run and field, so they could be moved between runs unnoticed)."""

    NAME = "aesgcm"
    NONCE_SIZE = 12
    KEY_SIZES = (16, 24, 32)
    binds_context = True
    """``encode``/``decode`` take ``context``: ``CodecStore`` passes each value's place."""

    def __init__(
        self,
        keys: Mapping[str, bytes] | Sequence[tuple[str, bytes]],
        *,
        accept_plaintext: bool = False,
        accept_unbound: bool = True,
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
        self._mac_key = b""
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
            if not self._mac_key:  # (the first key's)
                self._mac_key = hmac.new(bytes(key), DIGEST_KEY_LABEL, hashlib.sha256).digest()
        self.current_key_id: str = pairs[-1][0]
        self.accept_plaintext = accept_plaintext
        self.accept_unbound = accept_unbound

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The key ids this codec can decrypt with, oldest first."""
        return tuple(self._keys)

    @property
    def marker(self) -> str:
        """What ``CodecStore`` records in the store's metadata: the codec and the key id it
        encrypts with (never key material)."""
        return f"{self.NAME} kid={self.current_key_id}"

    def __repr__(self) -> str:  # never shows key material
        return f"AESGCMCodec(key_ids={list(self._keys)!r}, current={self.current_key_id!r})"

    def keyed_digest(self, data: bytes) -> str:
        """A keyed digest of ``data`` (32 hex digits of HMAC-SHA256 under the MAC key derived
        from the first key): equal data, equal digests, and without the key nobody can compute
        one, so a stored digest cannot be checked against guessed values. ``CodecStore`` keys
        the digests published events are matched on with it. It depends on the first key
        only: appending keys (rotation) keeps it; dropping the first key changes it, so events
        buffered and waits registered before then no longer match those made after."""
        return hmac.new(self._mac_key, data, hashlib.sha256).hexdigest()[:32]

    @staticmethod
    def _aad(kid: str, version: int, context: Sequence[str]) -> bytes:
        if version == 1:
            return b"flowkit.codec.aesgcm/1:" + kid.encode()
        # a JSON array: unambiguous whatever the run ids and names contain
        return orjson.dumps([f"flowkit.codec.aesgcm/{version}", kid, *context])

    def encode(self, value: Any, *, context: Sequence[str] = ()) -> Any:
        """The envelope of ``value``, bound to ``context`` (the same must be given to decode)."""
        kid = self.current_key_id
        plaintext = orjson.dumps(value)
        # A fresh random nonce per value. os.urandom is deliberate: this is cryptographic
        # material, not engine scheduling randomness (which comes from the injected RNG), and
        # it never influences replay: decoding returns the same value whatever the nonce.
        nonce = os.urandom(self.NONCE_SIZE)
        aad = self._aad(kid, ENVELOPE_VERSION, context)
        sealed = self._keys[kid].encrypt(nonce, plaintext, aad)
        return {
            "$codec": self.NAME,
            "v": ENVELOPE_VERSION,
            "kid": kid,
            "data": base64.b64encode(nonce + sealed).decode("ascii"),
        }

    def decode(self, value: Any, *, context: Sequence[str] = ()) -> Any:
        """The value of an envelope written for ``context``; ``CodecError`` otherwise."""
        if not (isinstance(value, dict) and value.get("$codec") == self.NAME):
            if self.accept_plaintext:
                return value
            raise CodecError(
                f"stored payload is not AES-GCM encoded ({type(value).__name__}); pass "
                "accept_plaintext=True to read payloads written without the codec"
            )
        kid = value.get("kid")
        data = value.get("data")
        version = value.get("v", 1)
        if not isinstance(kid, str) or not isinstance(data, str):
            raise CodecError("malformed AES-GCM envelope (kid/data missing)")
        if type(version) is not int or version not in (1, ENVELOPE_VERSION):
            raise CodecError(f"unknown AES-GCM envelope version {version!r}", key_id=kid)
        if version == 1 and not self.accept_unbound:
            raise CodecError(
                "payload is a version 1 envelope, not bound to its run and field, and this "
                "codec was built with accept_unbound=False",
                key_id=kid,
            )
        aead = self._keys.get(kid)
        if aead is None:
            raise CodecError(
                f"payload was encrypted with key id {kid!r}, which this codec does not have "
                f"(known key ids: {', '.join(map(repr, self._keys))})",
                key_id=kid,
                missing_key=True,
            )
        from cryptography.exceptions import InvalidTag

        try:
            raw = base64.b64decode(data, validate=True)
            if len(raw) < self.NONCE_SIZE + _TAG_SIZE:
                raise ValueError("too short")
            plaintext = aead.decrypt(
                raw[: self.NONCE_SIZE], raw[self.NONCE_SIZE :], self._aad(kid, version, context)
            )
        except (InvalidTag, ValueError, binascii.Error):
            raise CodecError(
                f"payload encrypted with key id {kid!r} failed authentication: it was "
                "tampered with, corrupted, or moved here from another run or field",
                key_id=kid,
            ) from None
        try:
            return orjson.loads(plaintext)
        except orjson.JSONDecodeError as exc:  # authenticated, so only a foreign writer
            raise CodecError(f"decrypted payload is not JSON: {exc}", key_id=kid) from None


__all__ = ["ENVELOPE_VERSION", "AESGCMCodec"]
