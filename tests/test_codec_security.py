"""``CodecStore`` security (issue #19, item 7): the arguments' digest is encrypted (a 6-digit
PIN cannot be brute-forced from the database), every envelope is bound to its run and field
(ciphertext pasted from another run or field fails with ``CodecError`` on a real SQLite file),
version 1 envelopes and plain digests written before still read, and a tampered value in a
live run raises ``CodecError`` naming the run and field instead of completing the run."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from store_kit import K1, K2, SECRET, codec, secret_run

import flowkit
from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit._core.serde import digest
from flowkit.errors import CodecError, NonDeterminismError
from flowkit.events import StepCompleted
from flowkit.stores.codec import STRING_PREFIX, AESGCMCodec, CodecStore
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql._schema import events as events_table
from flowkit.stores.sql._schema import runs as runs_table
from flowkit.stores.sql._schema import signals as signals_table

PIN = "493817"


@workflow(name="pin_check")
class PinCheck:
    def verify(self, pin: str) -> bool:
        return pin == PIN

    async def run(self, ctx: WorkflowCtx, input: str) -> bool:
        ok: bool = await ctx.step(self.verify, input)
        return ok


@workflow(name="pin_check")
class PinCheckChanged:
    """Same workflow name, another step where ``verify`` was: replay must diverge."""

    def verify_v2(self, pin: str) -> bool:
        return pin == PIN

    async def run(self, ctx: WorkflowCtx, input: str) -> bool:
        ok: bool = await ctx.step(self.verify_v2, input)
        return ok


async def until(cond: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(3000):  # bounded polling of a condition, not a timed guess
        if await cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never became true")


def sqlite_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))


def raw_events(url: str, run_id: str) -> list[dict[str, Any]]:
    """The stored event bodies of ``run_id``, read with SQLAlchemy (no flowkit decoding)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(events_table.c.body)
                .where(events_table.c.run_id == run_id)
                .order_by(events_table.c.seq)
            ).all()
    finally:
        engine.dispose()
    return [r[0] if isinstance(r[0], dict) else orjson.loads(r[0]) for r in rows]


def execute(url: str, stmt: Any) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(stmt)
    finally:
        engine.dispose()


async def run_pin(store: Any, run_id: str = "login") -> None:
    async with flowkit.Engine(store, [PinCheck()], poll_interval=0.05) as engine:
        await engine.start("pin_check", PIN, run_id)
        assert await engine.result(run_id, timeout=30) is True


# -- 1. the arguments' digest ---------------------------------------------------------------


def candidate_digests() -> dict[str, str]:
    """The plain digests of 2,000 six-digit PINs, the real one among them (a brute force
    over all 10^6 works the same way, only longer)."""
    pins = [f"{n:06d}" for n in range(0, 1_000_000, 500)] + [PIN]
    return {digest((p,), {}): p for p in pins}


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "codec"])
async def test_args_digest_of_a_pin_cannot_be_brute_forced(encrypted: bool, tmp_path: Path) -> None:
    path = tmp_path / "pin.db"
    url = f"sqlite:///{path}"
    inner = SqlStore(url)
    store: Any = CodecStore(inner, codec()) if encrypted else inner
    try:
        await run_pin(store)
        history = await store.load_events("login")
    finally:
        inner.close()
    real = digest((PIN,), {})
    # through the store the digest is the plain one, as the engine computed it
    (step,) = [e for e in history if isinstance(e, StepCompleted)]
    assert step.args_digest == real
    stored = next(
        e["args_digest"] for e in raw_events(url, "login") if e["type"] == "step_completed"
    )
    table = candidate_digests()
    if not encrypted:  # (what the issue measured: the stored digest gives the PIN away)
        assert stored == real and table[stored] == PIN
        assert real.encode() in sqlite_bytes(path)
        return
    # encrypted: an envelope bound to its run and field; no candidate digest matches it, and
    # neither the plain digest nor the PIN is anywhere in the file
    assert isinstance(stored, str) and stored.startswith(STRING_PREFIX)
    assert stored not in table and all(d not in stored for d in table)
    raw = sqlite_bytes(path)
    assert real.encode() not in raw and PIN.encode() not in raw
    envelope = orjson.loads(stored[len(STRING_PREFIX) :])
    assert envelope["v"] == 2 and envelope["kid"] == "k1"
    # the same arguments give another ciphertext each time (nothing to build a table from)
    other = codec().encode(real, context=("login", "event", "step_completed", "0", "args_digest"))
    assert other["data"] != envelope["data"]


async def test_replay_of_an_encrypted_run_matches_and_still_diverges(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    store = CodecStore(SqlStore(url), codec())
    try:
        await run_pin(store)
        history = await store.load_events("login")
    finally:
        store.close()
    h = flowkit.History(run_id="login", events=history)
    await flowkit.replay_async(h, PinCheck())  # matches
    with pytest.raises(NonDeterminismError) as ei:
        await flowkit.replay_async(h, PinCheckChanged())
    # the report shows the recorded digest decrypted: comparable with the new call's
    report = str(ei.value)
    assert digest((PIN,), {}) in report and "PinCheck.verify" in report
    assert STRING_PREFIX not in report


# -- 2. envelopes bound to their run and field ----------------------------------------------


async def two_runs(url: str) -> tuple[SqlStore, CodecStore]:
    inner = SqlStore(url)
    store = CodecStore(inner, codec())
    alice = secret_run("alice")
    carol = secret_run("carol")
    await store.create_run(alice, [])
    await store.create_run(replace(carol, input={"card": "4111-CAROL"}), [])
    return inner, store


def raw_run_column(url: str, run_id: str, column: str) -> Any:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.select(runs_table.c[column]).where(runs_table.c.id == run_id)
            ).scalar_one()
    finally:
        engine.dispose()


async def test_pasting_another_runs_ciphertext_fails_authentication(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'paste.db'}"
    inner, store = await two_runs(url)
    try:
        got = await store.get_run("carol")
        assert got is not None and got.input == {"card": "4111-CAROL"}
        carols = raw_run_column(url, "carol", "input")
        assert carols["$codec"] == "aesgcm" and carols["v"] == 2
        execute(url, sa.update(runs_table).where(runs_table.c.id == "alice").values(input=carols))
        with pytest.raises(CodecError, match="failed authentication") as ei:
            await store.get_run("alice")
        assert (ei.value.run_id, ei.value.field, ei.value.key_id) == ("alice", "input", "k1")
        assert not ei.value.missing_key  # the value is bad, not this process's keys
        assert "'alice'" in str(ei.value) and "4111" not in str(ei.value)
        listed = await store.list_runs()  # (no payloads: nothing to decode in a list)
        assert all(r.input is None for r in listed) and len(listed) == 2, listed
        assert (await store.get_run("carol")) == got  # carol's own stays readable
    finally:
        inner.close()


async def test_pasting_another_fields_ciphertext_fails_authentication(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'field.db'}"
    inner = SqlStore(url)
    store = CodecStore(inner, codec())
    try:
        await run_pin(store, "r1")
        await run_pin(store, "r2")
        # the run's output pasted into its input: same run, another field
        output = raw_run_column(url, "r1", "output")
        execute(url, sa.update(runs_table).where(runs_table.c.id == "r1").values(input=output))
        with pytest.raises(CodecError) as ei:
            await store.get_run("r1")
        assert (ei.value.run_id, ei.value.field) == ("r1", "input")
        # r2's step result pasted into r1's: the history fails, naming the event's field
        r2_step = next(e for e in raw_events(url, "r2") if e["type"] == "step_completed")
        r1_step = next(e for e in raw_events(url, "r1") if e["type"] == "step_completed")
        body = {**r1_step, "result": r2_step["result"]}
        ev = events_table.c
        execute(
            url,
            sa.update(events_table)
            .where(ev.run_id == "r1", ev.seq == r1_step["seq"])
            .values(body=body),
        )
        with pytest.raises(CodecError) as ei:
            await store.load_events("r1")
        assert ei.value.run_id == "r1"
        assert ei.value.field == f"event/step_completed/{r1_step['pos']}/result"
        # r2 itself is untouched
        assert [e.type for e in await store.load_events("r2")][-1] == "run_completed"
    finally:
        inner.close()


async def test_pasting_an_inbox_signal_into_another_run_or_name_fails(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inbox.db'}"
    inner, store = await two_runs(url)
    try:
        await store.deliver_signal("carol", "pay", {"card": "4111-CAROL"}, 1.0)
        await store.deliver_signal("alice", "note", "hello", 1.0)
        sig = await store.peek_signal("carol", "pay")
        assert sig is not None and sig.payload == {"card": "4111-CAROL"}
        # move carol's signal to alice (same name), then rename alice's own signal
        s = signals_table.c
        execute(url, sa.update(signals_table).where(s.run_id == "carol").values(run_id="alice"))
        with pytest.raises(CodecError) as ei:
            await store.peek_signal("alice", "pay")
        assert (ei.value.run_id, ei.value.field) == ("alice", "signal/pay")
        execute(url, sa.update(signals_table).where(s.name == "note").values(name="other"))
        with pytest.raises(CodecError):
            await store.peek_signal("alice", "other")
    finally:
        inner.close()


def v1_envelope(key: bytes, kid: str, value: Any) -> dict[str, Any]:
    """An envelope as flowkit wrote it before issue #19 (key id alone as associated data)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = bytes(range(12))
    sealed = AESGCM(key).encrypt(
        nonce, orjson.dumps(value), b"flowkit.codec.aesgcm/1:" + kid.encode()
    )
    return {"$codec": "aesgcm", "kid": kid, "data": base64.b64encode(nonce + sealed).decode()}


async def test_version_1_envelopes_and_plain_digests_still_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'v1.db'}"
    inner = SqlStore(url)
    try:
        old = secret_run("old")
        stored = replace(old, input=v1_envelope(K1, "k1", {"s": SECRET}))
        step = StepCompleted(
            pos="0", name="f", result=v1_envelope(K1, "k1", [1]), args_digest="0123456789ab", at=1.0
        )
        await inner.create_run(stored, [step])
        # rotated since: the old key decrypts the unbound envelopes; the plain digest reads as is
        rotated = CodecStore(inner, AESGCMCodec([("k1", K1), ("k2", K2)]))
        got = await rotated.get_run("old")
        assert got is not None and got.input == {"s": SECRET}
        (ev,) = await rotated.load_events("old")
        assert isinstance(ev, StepCompleted) and ev.result == [1]
        assert ev.args_digest == "0123456789ab"
        # an unbound envelope is not tied to its run: a deployment can refuse them
        strict = CodecStore(inner, AESGCMCodec([("k1", K1)], accept_unbound=False))
        with pytest.raises(CodecError, match="version 1") as ei:
            await strict.get_run("old")
        assert ei.value.run_id == "old" and ei.value.field == "input"
        # and what the rotated codec writes is bound (v2) with the new key
        await rotated.create_run(secret_run("new"), [])
        raw = raw_run_column(url, "new", "input")
        assert (raw["v"], raw["kid"]) == (2, "k2")
    finally:
        inner.close()


def test_codec_context_must_match() -> None:
    c = AESGCMCodec({"k": K1})
    enc = c.encode({"v": SECRET}, context=("r1", "input"))
    assert c.decode(enc, context=("r1", "input")) == {"v": SECRET}
    for wrong in [("r2", "input"), ("r1", "output"), ("r1",), (), ("r1", "input", "")]:
        with pytest.raises(CodecError, match="another run or field"):
            c.decode(enc, context=wrong)
    # no ambiguity between the parts of a context
    enc2 = c.encode(1, context=("a/b", "c"))
    with pytest.raises(CodecError):
        c.decode(enc2, context=("a", "b/c"))
    with pytest.raises(CodecError, match="version 7"):
        c.decode({**enc, "v": 7})


# -- 4. a tampered value in a live run ------------------------------------------------------


@workflow(name="two_phase")
class TwoPhase:
    def fetch(self, n: int) -> dict[str, Any]:
        return {"secret": SECRET, "n": n}

    def use(self, got: dict[str, Any]) -> str:
        return f"{got['secret']}:{got['n']}"

    async def run(self, ctx: WorkflowCtx, input: int) -> str:
        got = await ctx.step(self.fetch, input)
        await ctx.wait_for_signal("go")
        out: str = await ctx.step(self.use, got)
        return out


def flip_result(url: str, run_id: str, type_: str = "step_completed") -> dict[str, Any]:
    """Flip one bit of the ciphertext of ``run_id``'s first ``type_`` event's result."""
    body = next(e for e in raw_events(url, run_id) if e["type"] == type_)
    raw = bytearray(base64.b64decode(body["result"]["data"]))
    raw[20] ^= 0x01
    tampered = {**body, "result": {**body["result"], "data": base64.b64encode(raw).decode()}}
    ev = events_table.c
    execute(
        url,
        sa.update(events_table)
        .where(ev.run_id == run_id, ev.seq == body["seq"])
        .values(body=tampered),
    )
    return tampered


async def test_tampered_step_result_in_a_live_run_never_completes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    inner = SqlStore(url)
    store = CodecStore(inner, codec())
    try:
        async with flowkit.Engine(store, [TwoPhase()], poll_interval=0.02) as engine:
            await engine.start("two_phase", 7, "live")

            async def suspended() -> bool:
                run = await store.get_run("live")
                return run is not None and run.status is RunStatus.SUSPENDED

            await until(suspended)
            tampered = flip_result(url, "live")
            # at the store: one CodecError naming the run and the field, nothing else
            with pytest.raises(CodecError, match="failed authentication") as ei:
                await store.load_events("live")
            assert ei.value.run_id == "live"
            assert ei.value.field == f"event/step_completed/{tampered['pos']}/result"
            # the worker resumes it on the signal and meets the tampered value
            caplog.set_level(logging.WARNING, logger="flowkit")
            await engine.signal("live", "go", None)

            async def codec_error_seen() -> bool:
                return any(
                    (r.exc_info is not None and isinstance(r.exc_info[1], CodecError))
                    or "failed authentication" in r.getMessage()
                    for r in caplog.records
                )

            await until(codec_error_seen)
        raw = await inner.get_run("live")
        assert raw is not None
        # never completed with garbage: the tampered value was not used
        assert raw.status is not RunStatus.COMPLETED and raw.output is None
        # (with the worker's poison handling merged: BLOCKED or FAILED with the CodecError)
        if raw.status in (RunStatus.BLOCKED, RunStatus.FAILED):
            assert raw.error is not None and "CodecError" in orjson.dumps(raw.error).decode()
        assert not any(
            isinstance(e, StepCompleted) and e.name == "TwoPhase.use"
            for e in await inner.load_events("live")
        )
    finally:
        inner.close()
