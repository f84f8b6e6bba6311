"""The encryption marker (issue #19, item 7): a ``CodecStore`` records in its inner store's
metadata that payloads are encrypted (the codec and key id, never the key), and a plain store
object on that database refuses every write that would put a payload in clear (and claims),
with ``EncryptedStoreError``, writing nothing; reads and payload-free writes still work."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import K1, PG, SECRET, T0, codec, fresh_database, secret_run

from flowkit import RunStatus
from flowkit.errors import CodecError, EncryptedStoreError, FlowkitError
from flowkit.events import CancelRequested, SignalReceived, StepCompleted, TimerFired
from flowkit.stores import MemoryStore
from flowkit.stores.base import Update
from flowkit.stores.codec import AESGCMCodec, CodecStore
from flowkit.stores.sql import SqlStore


def open_pair(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Any, Any]:
    """Two store objects on one database: the one a CodecStore wraps, and a plain one."""
    if kind == "memory":
        m = MemoryStore()
        return m, MemoryStore(_data=m._d)
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'marked.db'}"
    else:
        url = fresh_database(request.getfixturevalue("pg_server"))
    return SqlStore(url), SqlStore(url)


def close(*stores: Any) -> None:
    for s in stores:
        if isinstance(s, SqlStore):
            s.close()


@pytest.mark.parametrize("kind", ["memory", "sqlite", PG])
async def test_a_plain_store_refuses_payloads_on_an_encrypted_database(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    inner, plain = open_pair(kind, request, tmp_path)
    try:
        assert await inner.codec_marker() is None
        enc = CodecStore(inner, AESGCMCodec({"2025-01": K1}))
        assert await enc.codec_marker() is None  # recorded on the first write, not before
        run = replace(
            secret_run("r"), status=RunStatus.RUNNING, lease_owner="w", lease_expires=T0 + 30
        )
        await enc.create_run(run, [])
        assert await inner.codec_marker() == "aesgcm kid=2025-01"
        assert await plain.codec_marker() == "aesgcm kid=2025-01"
        events_before = await enc.load_events("r")

        def refused(ei: pytest.ExceptionInfo[EncryptedStoreError]) -> None:
            assert ei.value.marker == "aesgcm kid=2025-01"
            assert ei.value.missing_key  # this process lacks the keys: not the run's fault
            assert isinstance(ei.value, CodecError) and isinstance(ei.value, FlowkitError)
            assert "encrypted (aesgcm kid=2025-01)" in str(ei.value)
            assert "--codec-keys" in str(ei.value)

        with pytest.raises(EncryptedStoreError, match="deliver signal 'go'") as ei:
            await plain.deliver_signal("r", "go", {"s": SECRET}, T0 + 1)
        refused(ei)
        assert await enc.peek_signal("r", "go") is None
        with pytest.raises(EncryptedStoreError, match="create run 'p'") as ei:
            await plain.create_run(secret_run("p"), [])
        refused(ei)
        assert await enc.get_run("p") is None
        sig = SignalReceived(pos="0", name="go", payload={"s": SECRET}, at=T0 + 1)
        with pytest.raises(EncryptedStoreError, match="commit a payload"):
            await plain.commit("r", "w", T0 + 1, Update(events=[sig]))
        with pytest.raises(EncryptedStoreError, match="commit a payload"):
            await plain.commit("r", "w", T0 + 1, Update(output={"s": SECRET}))
        step = StepCompleted(pos="0", name="f", result=None, args_digest="0123456789ab", at=T0 + 1)
        with pytest.raises(EncryptedStoreError, match="append a payload"):
            await plain.append_events("r", "w", T0 + 1, [step])
        with pytest.raises(EncryptedStoreError, match="claim run 'r'"):
            await plain.claim("r", "other", T0 + 100, T0 + 130)
        assert await enc.load_events("r") == events_before  # nothing was written
        got = await enc.get_run("r")
        assert got is not None and got.output is None and got.lease_owner == "w"
        assert SECRET not in repr(await plain.list_runs())

        # reads work without the keys (the payloads are envelopes), and so do the writes
        # that carry no payload: a signal without one, a timer, a cancel request
        raw = await plain.get_run("r")
        assert raw is not None and raw.input["$codec"] == "aesgcm"
        await plain.deliver_signal("r", "ping", None, T0 + 1)
        res = await plain.commit(
            "r",
            "w",
            T0 + 1,
            Update(events=[TimerFired(pos="1", at=T0 + 1), CancelRequested(at=T0 + 1)]),
        )
        assert len(res.seqs) == 2
        ping = await enc.peek_signal("r", "ping")
        assert ping is not None and ping.payload is None
        # the wrapper itself (and a second CodecStore on the same database) still writes
        await enc.deliver_signal("r", "go", {"s": SECRET}, T0 + 2)
        sig2 = await enc.peek_signal("r", "go")
        assert sig2 is not None and sig2.payload == {"s": SECRET}
        other = CodecStore(plain, AESGCMCodec({"2025-01": K1}))
        await other.create_run(secret_run("q"), [])
        assert (await enc.get_run("q")) is not None
        assert await plain.codec_marker() == "aesgcm kid=2025-01"  # the first one stays
    finally:
        close(inner, plain)


async def test_the_marker_is_a_flowkit_meta_row_without_key_material(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite:///{path}"
    store = CodecStore(SqlStore(url), codec())
    try:
        await store.create_run(secret_run("r"), [])
    finally:
        store.close()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT key, value FROM flowkit_meta")).all())
    finally:
        engine.dispose()
    assert rows["payload_codec"] == "aesgcm kid=k1"
    import base64

    raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    for form in (K1, K1.hex().encode(), base64.b64encode(K1)):
        assert form not in raw
    # a plain store on a fresh process's view of the file refuses at once
    plain = SqlStore(url)
    try:
        with pytest.raises(EncryptedStoreError):
            await plain.deliver_signal("r", "go", 1, T0)
    finally:
        plain.close()


async def test_a_plain_store_on_a_plain_database_checks_once_and_writes() -> None:
    store = MemoryStore()
    await store.create_run(secret_run("r"), [])
    await store.deliver_signal("r", "go", {"s": SECRET}, T0)
    assert await store.codec_marker() is None
    sig = await store.peek_signal("r", "go")
    assert sig is not None and sig.payload == {"s": SECRET}


class CustomCodec:
    """A codec without ``marker`` or ``context``: its class name is the marker."""

    def encode(self, value: Any) -> Any:
        return {"wrapped": value}

    def decode(self, value: Any) -> Any:
        if not isinstance(value, dict) or "wrapped" not in value:
            raise ValueError("not wrapped")
        return value["wrapped"]


async def test_a_custom_codec_marks_and_its_failures_are_codec_errors() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, CustomCodec())
    await store.create_run(secret_run("r"), [])
    assert await inner.codec_marker() == "CustomCodec"
    assert (await store.get_run("r")).input == {"s": SECRET}  # type: ignore[union-attr]
    # a value the custom codec cannot read: its ValueError becomes a CodecError naming it
    inner._d.runs["r"] = replace(inner._d.runs["r"], output="garbage")
    with pytest.raises(CodecError, match="ValueError: not wrapped") as ei:
        await store.get_run("r")
    assert (ei.value.run_id, ei.value.field) == ("r", "output")


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_a_plain_store_notices_a_database_encrypted_after_it_looked(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain store that found no marker re-checks after ``CodecMark.RECHECK`` seconds: a
    database a ``CodecStore`` encrypted meanwhile (a deploy turning the codec on while plain
    processes still run) is refused from then on, not never. (A plain ``MemoryStore`` looks
    at its in-process metadata at every write: no window.)"""
    from flowkit.stores.codec._mark import CodecMark

    inner, plain = open_pair(kind, request, tmp_path)
    try:
        await plain.create_run(secret_run("before"), [])  # looked: no marker, settled
        enc = CodecStore(inner, AESGCMCodec({"2025-01": K1}))
        await enc.create_run(secret_run("r"), [])  # the database is encrypted now
        # within RECHECK the plain store still trusts what it found (the documented window)
        await plain.create_run(secret_run("window"), [])
        monkeypatch.setattr(CodecMark, "RECHECK", 0.0)
        plain._mark.settled = True  # (settled again, with the window now 0 s)
        with pytest.raises(EncryptedStoreError):
            await plain.create_run(secret_run("after"), [])
        assert await plain.get_run("after") is None
    finally:
        close(inner, plain)
