"""``AESGCMCodec``: round trips with random nonces, key rotation (alone and through a
store), unknown keys, tampering (in the envelope and in a stored row), plaintext refused
unless accepted, and the keys it refuses."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import K1, K2, K3, SECRET, codec, fresh_database, secret_run

from flowkit.errors import FlowkitError
from flowkit.stores import MemoryStore
from flowkit.stores.codec import AESGCMCodec, Codec, CodecError, CodecStore
from flowkit.stores.sql import SqlStore


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / name}"
    return fresh_database(request.getfixturevalue("pg_server"))


# -- AESGCMCodec -------------------------------------------------------------------------


def test_codec_round_trip_and_random_nonces() -> None:
    c = codec()
    assert isinstance(c, Codec)
    values = [SECRET, 0, 1.0, -2.5, True, None, [], {}, {"a": [1, {"b": "é"}]}, "x" * 10_000]
    for v in values:
        enc = c.encode(v)
        assert set(enc) == {"$codec", "v", "kid", "data"} and enc["kid"] == "k1" and enc["v"] == 2
        got = c.decode(enc)
        assert got == v and type(got) is type(v)
    a, b = c.encode(SECRET), c.encode(SECRET)
    assert a["data"] != b["data"]  # a fresh nonce per value
    assert SECRET not in repr(a) and "K1" not in repr(c) and repr(K1) not in repr(c)


def test_key_rotation_old_key_decrypts_new_key_encrypts() -> None:
    old = AESGCMCodec({"2024": K2})
    rotated = AESGCMCodec({"2024": K2, "2025": K1})
    assert rotated.current_key_id == "2025" and rotated.key_ids == ("2024", "2025")
    from_old = old.encode({"v": SECRET})
    assert from_old["kid"] == "2024"
    assert rotated.decode(from_old) == {"v": SECRET}
    from_new = rotated.encode({"v": SECRET})
    assert from_new["kid"] == "2025"
    assert rotated.decode(from_new) == {"v": SECRET}
    # the old deployment cannot read what the new key wrote: one clear error naming the key
    with pytest.raises(CodecError, match="'2025'") as ei:
        old.decode(from_new)
    assert ei.value.key_id == "2025" and isinstance(ei.value, FlowkitError)
    # a sequence of pairs: the last one is the newest
    seq = AESGCMCodec([("b", K3), ("2024", K2)])
    assert seq.current_key_id == "2024" and seq.decode(old.encode(1)) == 1


async def test_key_rotation_through_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'rot.db'}"
    inner = SqlStore(url)
    try:
        v1 = CodecStore(inner, AESGCMCodec({"k1": K1}))
        await v1.create_run(secret_run("before"), [])
        v2 = CodecStore(inner, AESGCMCodec({"k1": K1, "k2": K2}))
        got = await v2.get_run("before")  # old key still decrypts
        assert got is not None and got.input == {"s": SECRET}
        await v2.create_run(secret_run("after"), [])
        raw_before, raw_after = await inner.get_run("before"), await inner.get_run("after")
        assert raw_before is not None and raw_before.input["kid"] == "k1"
        assert raw_after is not None and raw_after.input["kid"] == "k2"  # new key encrypts
        assert (await v2.get_run("after")) == replace(got, id="after")
        # dropping k1 too early: unknown key id -> CodecError naming it
        v3 = CodecStore(inner, AESGCMCodec({"k2": K2}))
        assert (await v3.get_run("after")) is not None
        with pytest.raises(CodecError, match="key id 'k1'") as ei:
            await v3.get_run("before")
        assert ei.value.key_id == "k1" and ei.value.missing_key
        # (lists carry no payloads: nothing to decode, so the missing key does not matter)
        listed = await v3.list_runs()
        assert sorted(r.id for r in listed) == ["after", "before"]
        assert all(r.input is None for r in listed)
    finally:
        inner.close()


def test_unknown_key_id_is_one_clear_error() -> None:
    enc = AESGCMCodec({"gone": K3}).encode("x")
    with pytest.raises(CodecError) as ei:
        codec().decode(enc)
    assert ei.value.key_id == "gone"
    assert "'gone'" in str(ei.value) and "'k1'" in str(ei.value)


def _flip(data: str, i: int) -> str:
    import base64

    raw = bytearray(base64.b64decode(data))
    raw[i] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag", "kid", "truncated", "b64"])
def test_tampering_is_detected(where: str) -> None:
    c = AESGCMCodec({"a": K1, "b": K2})
    enc = c.encode({"v": SECRET})
    bad = dict(enc)
    if where == "nonce":
        bad["data"] = _flip(enc["data"], 0)
    elif where == "ciphertext":
        bad["data"] = _flip(enc["data"], 14)
    elif where == "tag":
        bad["data"] = _flip(enc["data"], -1)
    elif where == "kid":  # re-labelled to another known key: the key id is bound as AAD
        bad["kid"] = "a"
    elif where == "truncated":
        bad["data"] = enc["data"][:16]
    else:
        bad["data"] = "not base64!"
    with pytest.raises(CodecError):
        c.decode(bad)


async def test_tampered_row_raises_codec_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    inner = SqlStore(url)
    store = CodecStore(inner, codec())
    try:
        await store.create_run(secret_run("r"), [])
        raw = await inner.get_run("r")
        assert raw is not None
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            from flowkit.stores.sql._schema import runs

            with engine.begin() as conn:
                conn.execute(
                    sa.update(runs).values(
                        input={**raw.input, "data": _flip(raw.input["data"], 20)}
                    )
                )
        finally:
            engine.dispose()
        with pytest.raises(CodecError, match="tampered"):
            await store.get_run("r")
    finally:
        store.close()


def test_plaintext_is_refused_unless_accepted() -> None:
    with pytest.raises(CodecError, match="not AES-GCM encoded"):
        codec().decode({"s": SECRET})
    lenient = AESGCMCodec({"k1": K1}, accept_plaintext=True)
    assert lenient.decode({"s": SECRET}) == {"s": SECRET}
    assert lenient.decode(lenient.encode([1])) == [1]


async def test_wrapping_a_plaintext_store_with_accept_plaintext() -> None:
    inner = MemoryStore()
    await inner.create_run(secret_run("old"), [])
    with pytest.raises(CodecError):
        await CodecStore(inner, codec()).get_run("old")
    lenient = CodecStore(inner, AESGCMCodec({"k1": K1}, accept_plaintext=True))
    got = await lenient.get_run("old")
    assert got is not None and got.input == {"s": SECRET}
    await lenient.create_run(secret_run("new"), [])
    raw = await inner.get_run("new")
    assert raw is not None and raw.input["$codec"] == "aesgcm"


@pytest.mark.parametrize(
    "keys",
    [
        {"k": b"short"},
        {"k": bytes(15)},
        {"k": bytes(33)},
        {"k": bytes(64)},
        {"k": "0" * 32},
        {"": bytes(32)},
        {},
        [],
        [("a", bytes(32)), ("a", bytes(16))],
    ],
)
def test_bad_keys_are_refused_at_construction(keys: Any) -> None:
    with pytest.raises(ValueError):
        AESGCMCodec(keys)


def test_valid_key_sizes() -> None:
    for size in (16, 24, 32):
        c = AESGCMCodec({"k": os.urandom(size)})
        assert c.decode(c.encode("x")) == "x"


def test_codec_store_needs_a_codec() -> None:
    with pytest.raises(TypeError):
        CodecStore(MemoryStore(), object())  # type: ignore[arg-type]
