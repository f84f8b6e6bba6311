"""``CodecStore``: every payload kind round-trips through an engine exactly as on the plain
store, no plaintext reaches the database (SQLite file bytes, PostgreSQL rows), forwarding of
``try_admit_singleton``/``scoped`` and of ``append_events`` (a step's record: encoded, and only
over a store that has it), a worker without the key, and the conformance kit through it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from store_kit import K1, K2, PG, SECRET, T0, codec, drop_database, fresh_database, secret_run

import flowkit
from flowkit import RetryPolicy, Run, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.errors import WorkflowFailedError
from flowkit.events import (
    ErrorInfo,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    SignalReceived,
    SingletonGated,
    StepCompleted,
    StepFailed,
)
from flowkit.stores import MemoryStore
from flowkit.stores.base import Admission, Store, Update
from flowkit.stores.codec import STRING_PREFIX, AESGCMCodec, CodecError, CodecStore
from flowkit.stores.sql import SqlStore
from flowkit_testing import DEFAULT_START, TestEnv, VirtualClock


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / name}"
    return fresh_database(request.getfixturevalue("pg_server"))


class VaultIn(BaseModel):
    secret: str
    fail: bool = False


@workflow(name="vault")
class Vault:
    def fetch(self, secret: str) -> dict[str, Any]:
        return {"echo": secret, "floats": [1.0, 2.5], "none": None, "uni": "é✓"}

    def explode(self, secret: str) -> str:
        raise ValueError(f"explode {secret}")

    async def run(self, ctx: WorkflowCtx, input: VaultIn) -> dict[str, Any]:
        got = await ctx.step(self.fetch, input.secret)
        sig = await ctx.wait_for_signal("approve")
        if input.fail:
            await ctx.step(self.explode, input.secret, retry=RetryPolicy(max_attempts=2))
        return {"got": got, "sig": sig, "secret": input.secret}


async def vault_scenario(store: Any) -> dict[str, Any]:
    """Run the scenario on ``store``; everything observable through the engine."""
    out: dict[str, Any] = {}
    # a payload the worker cannot decode is retried forever (like any store failure): bound it
    async with asyncio.timeout(30), TestEnv([Vault()], seed=7, store=store) as env:
        await env.start("vault", {"secret": SECRET}, "ok")
        await env.start("vault", {"secret": SECRET, "fail": True}, "bad")
        await env.run_until_idle()
        await env.signal("ok", "extra", [f"{SECRET}-unconsumed"])  # stays in the inbox
        await env.signal("ok", "approve", {"token": f"{SECRET}-sig", "n": 10.0})
        await env.signal("bad", "approve", None)
        out["ok"] = await env.result("ok")
        with pytest.raises(WorkflowFailedError) as ei:
            await env.result("bad")
        out["bad_error"] = ei.value.error
        out["bad_cause"] = str(ei.value.cause)
        for rid in ("ok", "bad"):
            out[f"{rid}_run"] = await env.get_run(rid)
            out[f"{rid}_history"] = (await env.history(rid)).to_json()
        sig = await env.store.peek_signal("ok", "extra")
        out["extra"] = sig.payload if sig is not None else None
        out["runs"] = await env.store.list_runs()
    return out


def check_scenario(got: dict[str, Any]) -> None:
    assert got["ok"] == {
        "got": {"echo": SECRET, "floats": [1.0, 2.5], "none": None, "uni": "é✓"},
        "sig": {"token": f"{SECRET}-sig", "n": 10.0},
        "secret": SECRET,
    }
    assert isinstance(got["ok"]["sig"]["n"], float)
    assert got["bad_error"]["type"] == "StepFailedError"
    assert f"explode {SECRET}" in got["bad_error"]["message"]
    assert got["bad_error"]["cause_message"] == f"explode {SECRET}"
    assert f"explode {SECRET}" in got["bad_cause"]
    assert got["extra"] == [f"{SECRET}-unconsumed"]
    assert got["ok_run"].input == {"secret": SECRET, "fail": False}
    assert '"step_failed"' in got["bad_history"] and '"run_failed"' in got["bad_history"]
    assert '"signal_received"' in got["ok_history"]


def sqlite_bytes(url: str) -> bytes:
    """The database file and its WAL/SHM side files, as written on disk."""
    path = Path(url.removeprefix("sqlite:///"))
    parts = [p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))]
    assert parts, path
    return b"".join(parts)


def pg_rows(url: str) -> str:
    """Every row of every flowkit table, selected with SQLAlchemy, as text."""
    from flowkit.stores.sql._schema import metadata

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = [
                repr(tuple(r))
                for table in metadata.sorted_tables
                for r in conn.execute(sa.select(table))
            ]
    finally:
        engine.dispose()
    assert rows
    return "\n".join(rows)


def raw_bytes(kind: str, url: str) -> bytes:
    return sqlite_bytes(url) if kind == "sqlite" else pg_rows(url).encode()


Appended = list[tuple[list[Event], "tuple[int, ...] | None"]]


def log_appends(inner: SqlStore) -> Appended:
    """Log every ``inner.append_events`` call: the events as they reached ``inner`` and the
    seqs it returned (``None``: refused, the engine then committed them)."""
    calls: Appended = []
    real = inner.append_events

    async def append_events(
        run_id: str, owner: str, now: float, events: Any
    ) -> tuple[int, ...] | None:
        seqs = await real(run_id, owner, now, events)
        calls.append((list(events), seqs))
        return seqs

    inner.append_events = append_events  # type: ignore[method-assign]
    return calls


def appended(calls: Appended) -> list[Event]:
    """The events ``inner`` accepted through ``append_events``."""
    return [e for evs, seqs in calls if seqs for e in evs]


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_engine_round_trip_matches_plain_store_and_hides_plaintext(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    plain_url = _url(kind, request, tmp_path, "plain.db")
    plain = SqlStore(plain_url)
    try:
        on_plain = await vault_scenario(plain)
    finally:
        plain.close()
    enc_url = _url(kind, request, tmp_path, "enc.db")
    enc = CodecStore(SqlStore(enc_url), codec())
    assert enc.appends_events is True
    calls = log_appends(enc.inner)
    try:
        on_codec = await vault_scenario(enc)
    finally:
        enc.close()
    check_scenario(on_plain)
    # identical to the plain store: results, failures, snapshots, histories byte for byte
    assert on_codec == on_plain
    # the failed attempts of "bad"'s step were recorded with append_events, encoded
    failures = [e for e in appended(calls) if isinstance(e, StepFailed)]
    assert [(f.name, f.retry_at is None) for f in failures] == [
        ("Vault.explode", False),
        ("Vault.explode", True),
    ]
    assert all(f.error.message.startswith(STRING_PREFIX) for f in failures)

    # the plain store does hold the secret (so this test can fail) ...
    plain_raw = raw_bytes(kind, plain_url)
    for needle in (SECRET, "-unconsumed", "é✓"):
        assert needle.encode() in plain_raw, needle
    # ... the encrypted one holds no trace of it, but keeps the clear fields queryable
    raw = raw_bytes(kind, enc_url)
    for needle in (SECRET, "-unconsumed", "é✓", "TOP-SECRET"):
        assert needle.encode() not in raw, needle
    for clear in ("aesgcm", "vault", "StepFailedError", "explode", "approve", "extra"):
        assert clear.encode() in raw, clear  # names, types and signal names stay in clear
    # a fresh CodecStore on the same database reads it all back
    again = CodecStore(SqlStore(enc_url), codec())
    try:
        assert await again.list_runs() == on_plain["runs"]
        assert (await again.get_run("ok")) == on_plain["ok_run"]
    finally:
        again.close()


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_raw_columns_are_envelopes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = _url(kind, request, tmp_path, "enc.db")
    inner = SqlStore(url)
    store = CodecStore(inner, codec(("old", K2), ("new", K1)))
    try:
        await vault_scenario(store)
        raw_run = await inner.get_run("bad")
        assert raw_run is not None
        assert raw_run.input["$codec"] == "aesgcm" and raw_run.input["kid"] == "new"
        assert raw_run.output is None  # absent values stay null
        err = raw_run.error
        assert (
            err is not None and err["type"] == "StepFailedError" and err["step"] == "Vault.explode"
        )
        assert err["message"].startswith(STRING_PREFIX)
        assert err["cause_message"].startswith(STRING_PREFIX)
        assert raw_run.tags == () and raw_run.status is RunStatus.FAILED
        kinds = {e.type: e for e in await inner.load_events("bad")}
        started = kinds["run_started"]
        assert isinstance(started, RunStarted) and started.input["kid"] == "new"
        step_failed = kinds["step_failed"]
        assert isinstance(step_failed, StepFailed)
        assert step_failed.error.message.startswith(STRING_PREFIX)
        assert step_failed.name == "Vault.explode" and step_failed.error.type == "ValueError"
    finally:
        store.close()


# -- the wrapper on every payload kind, call by call ------------------------------------


async def _store_calls(store: Any) -> list[Any]:
    """Every payload-carrying store call, with what it returns."""
    out: list[Any] = []
    run = secret_run("r")
    first = RunStarted(seq=1, at=T0, workflow="wf", version="1", input=run.input, tags=["t1"])
    out.append(await store.create_run(run, [first]))
    out.append(await store.create_run(replace(run, input={"other": 1}), []))  # existing
    out.append(await store.deliver_signal("r", "sig", {"p": SECRET}, T0))
    out.append(await store.deliver_signal("r", "nul", None, T0))
    out.append(await store.peek_signal("r", "sig"))
    out.append(await store.peek_signal("r", "nul"))
    out.append(await store.peek_signal("r", "none"))
    out.append(await store.claim("r", "w", T0, T0 + 30))
    out.append(await store.renew_lease("r", "w", T0 + 40))
    info = ErrorInfo(type="ValueError", message=f"bad {SECRET}", step="s", attempts=1)
    sig = await store.peek_signal("r", "sig")
    res = await store.commit(
        "r",
        "w",
        T0 + 1,
        Update(
            events=[
                StepCompleted(pos="0", name="s", result=[SECRET, 1.5], at=T0 + 1),
                StepFailed(pos="1", name="f", error=info, retry_at=T0 + 2, at=T0 + 1),
                SignalReceived(pos="2", name="sig", payload=sig.payload, at=T0 + 1),
            ],
            consume_signal=sig.id,
        ),
    )
    out.append(res)
    failed = ErrorInfo(
        type="StepFailedError",
        message=f"step f failed: {SECRET}",
        step="f",
        attempts=2,
        cause_type="ValueError",
        cause_message=f"bad {SECRET}",
    )
    out.append(
        await store.commit(
            "r",
            "w",
            T0 + 3,
            Update(
                events=[RunFailed(error=failed, at=T0 + 3)],
                status=RunStatus.FAILED,
                error=failed.model_dump(),
            ),
        )
    )
    out.append(
        await store.commit(
            "r",
            None,
            T0 + 4,
            Update(status=RunStatus.PENDING, error=None, expect_status=frozenset({"failed"})),
        )
    )
    await store.claim("r", "w", T0 + 4, T0 + 30)
    out.append(
        await store.commit(
            "r",
            "w",
            T0 + 5,
            Update(
                events=[RunCompleted(output={"done": SECRET}, at=T0 + 5)],
                status=RunStatus.COMPLETED,
                output={"done": SECRET},
            ),
        )
    )
    out.append(await store.get_run("r"))
    out.append(await store.get_run("missing"))
    out.append(await store.list_runs(tag="t1"))
    out.append(await store.load_events("r"))
    out.append(await store.due_runs(T0 + 100, 10))
    out.append(await store.next_due_at())
    return out


async def test_every_store_call_round_trips_and_inner_holds_no_plaintext() -> None:
    plain = await _store_calls(MemoryStore())
    inner = MemoryStore()
    assert await _store_calls(CodecStore(inner, codec())) == plain
    dump = repr(inner._d)
    assert SECRET not in dump and "aesgcm" in dump
    raw_events = await inner.load_events("r")
    assert [e.type for e in raw_events] == [
        "run_started",
        "step_completed",
        "step_failed",
        "signal_received",
        "run_failed",
        "run_completed",
    ]


async def test_isinstance_store_and_scoped_views(tmp_path: Path) -> None:
    store = CodecStore(SqlStore(f"sqlite:///{tmp_path / 'ns.db'}"), codec())
    try:
        assert isinstance(store, Store)
        a, b = store.scoped("a"), store.scoped("b")
        assert isinstance(a, CodecStore) and a.namespace == "a" and store.namespace is None
        created, _ = await a.create_run(secret_run("r1"), [])
        assert created.namespace == "a" and created.input == {"s": SECRET}
        assert await b.get_run("r1") is None
        assert (await a.get_run("r1")) == created
        assert (await store.get_run("r1")) == created
        raw = await store.inner.get_run("r1")
        assert raw is not None and raw.input["$codec"] == "aesgcm"
    finally:
        store.close()


# -- a step's record: append_events ---------------------------------------------------------

STEP_SECRET = "STEP-ONLY-SECRET-5c1e"


@workflow(name="codec_steps")
class CodecSteps:
    """Its input and output are numbers: ``STEP_SECRET`` is only ever in the results of its
    ``reveal`` steps. A step's record is flushed before the next step runs (the engine then
    appends it), so each ``reveal`` is followed by a step; the last step's record travels in
    the final commit."""

    def reveal(self, n: int) -> str:
        return f"{STEP_SECRET}-{n}"

    def tally(self, *parts: str) -> int:
        return sum(map(len, parts))

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        a = await ctx.step(self.reveal, input)
        b = await ctx.step(self.reveal, input + 1)
        n: int = await ctx.step(self.tally, a, b)
        return n


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "codec"])
async def test_step_results_recorded_by_append_events_store_no_plaintext(
    encrypted: bool, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'steps.db'}"
    inner = SqlStore(url)
    store: Any = CodecStore(inner, codec()) if encrypted else inner
    assert store.appends_events is True
    calls = log_appends(inner)
    try:
        async with flowkit.Engine(store, [CodecSteps()], poll_interval=0.05) as engine:
            await engine.start("codec_steps", 1, "r")
            assert await engine.result("r", timeout=30) == 2 * len(f"{STEP_SECRET}-1")
        history = await store.load_events("r")
    finally:
        inner.close()
    done = [e for e in history if isinstance(e, StepCompleted)]
    secrets = [f"{STEP_SECRET}-1", f"{STEP_SECRET}-2"]
    assert [e.result for e in done] == [*secrets, 2 * len(secrets[0])]
    # both reveal records went through append_events (accepted: no fall-back commit) ...
    assert all(seqs for _, seqs in calls)
    steps = [e for e in appended(calls) if isinstance(e, StepCompleted)]
    assert [(e.pos, e.name) for e in steps] == [(e.pos, e.name) for e in done[:2]]
    assert all(e.name == "CodecSteps.reveal" for e in steps)
    if encrypted:  # ... as envelopes
        assert all(e.result["$codec"] == "aesgcm" for e in steps)
    else:
        assert [e.result for e in steps] == secrets
    # the plain database holds the results (so this test can fail), the encrypted one does not
    raw = sqlite_bytes(url)
    assert (STEP_SECRET.encode() in raw) is not encrypted
    assert b"reveal" in raw and b"step_completed" in raw  # step names and types stay clear


class NoAppendStore(MemoryStore):
    appends_events = False


async def test_append_events_goes_through_only_when_inner_appends_events() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, codec())
    assert store.appends_events is True
    run = replace(secret_run("r"), status=RunStatus.RUNNING, lease_owner="w", lease_expires=T0 + 30)
    await store.create_run(run, [])
    step = StepCompleted(pos="0", name="f", result={"s": SECRET}, at=T0 + 1)
    failure = StepFailed(
        pos="1", name="f", error=ErrorInfo(type="ValueError", message=SECRET), at=T0 + 1
    )
    assert await store.append_events("r", "w", T0 + 1, [step, failure]) == (1, 2)
    assert await store.append_events("r", "other", T0 + 1, [step]) is None
    assert await store.append_events("r", "w", T0 + 1, []) is None
    assert await store.load_events("r") == [
        step.model_copy(update={"seq": 1}),
        failure.model_copy(update={"seq": 2}),
    ]
    raw = await inner.load_events("r")
    assert raw[0].result["$codec"] == "aesgcm"  # type: ignore[union-attr]
    assert raw[1].error.message.startswith(STRING_PREFIX)  # type: ignore[union-attr]
    assert SECRET not in repr(inner._d)

    # over a store without the capability: no flag, and append_events is refused unsent
    for lacking in (NoAppendStore(), NoAppendStore(namespace="ns")):
        plain = CodecStore(lacking, codec())
        assert plain.appends_events is False
        await plain.create_run(run, [])
        with pytest.raises(TypeError, match="appends_events"):
            await plain.append_events("r", "w", T0 + 1, [step])
        assert await plain.load_events("r") == []
        assert (await plain.commit("r", "w", T0 + 1, Update(events=[step]))).seqs == (1,)
    assert store.scoped("a").appends_events is True


# -- singleton admission forwarding ------------------------------------------------------


class LaneIn(BaseModel):
    key: str
    n: int


@workflow(name="codec_lane", singleton=Singleton(key=lambda i: i.key))
class CodecLane:
    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        got = await ctx.wait_for_signal("go")
        return f"{input.n}:{got}"


async def test_singleton_admits_and_gates_through_codec_store(tmp_path: Path) -> None:
    inner = SqlStore(f"sqlite:///{tmp_path / 'lane.db'}")
    store = CodecStore(inner, codec())
    try:
        assert getattr(store, "try_admit_singleton", None) is not None
        async with TestEnv([CodecLane()], store=store) as env:
            await env.start("codec_lane", {"key": "A", "n": 1}, "first")
            await env.start("codec_lane", {"key": "A", "n": 2}, "second")
            await env.start("codec_lane", {"key": "B", "n": 3}, "other")
            await env.run_until_idle()
            first, second, other = [await env.get_run(r) for r in ("first", "second", "other")]
            assert first.admitted and other.admitted and not second.admitted
            assert second.status is RunStatus.SUSPENDED
            assert "singleton_gated" in (await env.history("second")).types
            await env.signal("first", "go", SECRET)
            assert await env.result("first") == f"1:{SECRET}"
            await env.run_until_idle()
            assert (await env.get_run("second")).admitted  # handed over
            await env.signal("second", "go", "x")
            await env.signal("other", "go", "y")
            assert await env.result("second") == "2:x"
            assert await env.result("other") == "3:y"
        raw = await inner.get_run("first")
        assert raw is not None and raw.singleton_key == "A"  # in clear for admission
        assert raw.output["$codec"] == "aesgcm"
    finally:
        store.close()


class NoCreateAdmissionStore(MemoryStore):
    admits_on_create = False


async def test_admission_at_creation_goes_through_only_when_inner_admits_on_create() -> None:
    inner = MemoryStore()
    store = CodecStore(inner, codec())
    assert store.admits_on_create is True
    tag = "singleton:A"

    def lane_run(run_id: str, t: float) -> Run:
        return replace(
            secret_run(run_id, singleton_key="A", lease_owner="w", lease_expires=t + 30),
            tags=(tag,),
            created_at=t,
            updated_at=t,
            status=RunStatus.RUNNING,
        )

    def started(run: Run) -> RunStarted:
        return RunStarted(at=run.created_at, workflow="wf", version="1", input=run.input)

    # a gated record carrying a payload is encoded like any other event
    gated = (
        SingletonGated(key="A", retry_at=T0 + 2, at=T0 + 1),
        SignalReceived(pos="0", name="note", payload={"s": SECRET}, at=T0 + 1),
    )
    h, created = await store.create_run(
        lane_run("h", T0), [started(lane_run("h", T0))], admission=Admission("wf", tag, 1, T0 + 1)
    )
    assert created and h.admitted and h.input == {"s": SECRET}
    w_run = lane_run("w", T0 + 1)
    w, created = await store.create_run(
        w_run, [started(w_run)], admission=Admission("wf", tag, 1, T0 + 2, gated)
    )
    assert created and not w.admitted
    assert (w.status, w.wake_at, w.lease_owner, w.input) == (
        RunStatus.SUSPENDED,
        T0 + 2,
        None,
        {"s": SECRET},
    )
    events = await store.load_events("w")
    assert [e.type for e in events] == ["run_started", "singleton_gated", "signal_received"]
    assert events[2].payload == {"s": SECRET}  # type: ignore[union-attr]
    raw = await inner.load_events("w")
    assert raw[2].payload["$codec"] == "aesgcm"  # type: ignore[union-attr]
    assert SECRET not in repr(inner._d)

    # over a store without the capability: no flag, and an Admission is refused unsent
    plain = CodecStore(NoCreateAdmissionStore(), codec())
    assert plain.admits_on_create is False
    with pytest.raises(TypeError, match="admits_on_create"):
        await plain.create_run(w_run, [], admission=Admission("wf", tag, 1, T0 + 2))
    assert await plain.get_run("w") is None
    assert (await plain.create_run(w_run, []))[1]  # a plain create still works


class NoneAdmitStore(MemoryStore):
    try_admit_singleton = None  # type: ignore[assignment]


class AbsentAdmitStore:
    """Forwards everything but ``try_admit_singleton`` (and ``scoped``) to a MemoryStore."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name in ("try_admit_singleton", "scoped"):
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.parametrize("inner_cls", [NoneAdmitStore, AbsentAdmitStore])
async def test_no_admission_when_inner_lacks_it(inner_cls: type) -> None:
    store = CodecStore(inner_cls(), codec())
    assert getattr(store, "try_admit_singleton", None) is None
    assert not hasattr(store, "try_admit_singleton")
    if inner_cls is AbsentAdmitStore:
        assert not hasattr(store, "scoped")
    async with TestEnv([CodecLane(), Vault()], store=store) as env:
        with pytest.raises(flowkit.UnsupportedStoreError):
            await env.start("codec_lane", {"key": "A", "n": 1}, "r1")
        assert await store.list_runs() == []
        # non-singleton workflows still run
        await env.start("vault", {"secret": SECRET}, "v")
        await env.run_until_idle()
        await env.signal("v", "approve", 1)
        assert (await env.result("v"))["secret"] == SECRET


# -- a process without the key: the run waits for it, it does not fail ---------------------


@workflow(name="codec_echo")
class CodecEcho:
    def shout(self, s: str) -> str:
        return s.upper()

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.step(self.shout, input)


async def test_worker_missing_a_key_leaves_the_run_until_the_key_is_deployed(
    tmp_path: Path,
) -> None:
    inner = SqlStore(f"sqlite:///{tmp_path / 'keys.db'}")
    try:
        clock = VirtualClock(DEFAULT_START)
        writer = CodecStore(inner, AESGCMCodec({"k1": K1}))
        client = flowkit.Engine(writer, [CodecEcho()], worker=False, clock=clock)
        await client.start("codec_echo", SECRET.lower(), "r")
        # a worker deployed with only the new key cannot read the run: one clear CodecError
        # on its first store call; nothing but the claim's lease is written
        new_only = CodecStore(inner, AESGCMCodec({"k2": K2}))
        now = clock.now()
        with pytest.raises(CodecError, match="key id 'k1'"):
            await new_only.claim("r", "worker-with-k2", now, now + 30)
        with pytest.raises(CodecError, match="key id 'k1'"):
            await new_only.load_events("r")
        raw = await inner.get_run("r")
        assert raw is not None and not raw.status.terminal and raw.output is None
        assert [e.type for e in await inner.load_events("r")] == ["run_started"]
        # with both keys the run is recovered once that lease expires; the output is
        # encrypted with the newest key
        rotated = CodecStore(inner, AESGCMCodec([("k1", K1), ("k2", K2)]))
        async with TestEnv([CodecEcho()], store=rotated, start=DEFAULT_START) as env:
            await env.advance(60)
            assert await env.result("r") == SECRET
        raw = await inner.get_run("r")
        assert raw is not None and raw.status is RunStatus.COMPLETED
        assert raw.input["kid"] == "k1" and raw.output["kid"] == "k2"
    finally:
        inner.close()


# -- the store conformance kit passes through the wrapper ---------------------------------


# (over SQLite files: tests/test_conformance.py's "codec" backend runs every check, each store
# object with its own codec)
@pytest.mark.parametrize("kind", ["memory", PG])
async def test_conformance_kit_passes_on_codec_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from flowkit_testing.conformance import CHECKS, run_all

    c = codec()
    opened: list[SqlStore] = []
    counter = iter(range(1_000))

    def sql(url: str) -> SqlStore:
        opened.append(SqlStore(url))
        return opened[-1]

    def new_url() -> str:
        return _url(kind, request, tmp_path, f"conf-{next(counter)}.db")

    def make_store() -> CodecStore:
        return CodecStore(MemoryStore() if kind == "memory" else sql(new_url()), c)

    def make_pair() -> tuple[CodecStore, CodecStore]:
        if kind == "memory":
            m = MemoryStore()
            return CodecStore(m, c), CodecStore(MemoryStore(_data=m._d), c)
        url = new_url()
        return CodecStore(sql(url), c), CodecStore(sql(url), c)

    # one check at a time, its stores closed before the next: every SqlStore holds its own
    # connections, and the whole kit's at once would exceed the test server's limit
    # (and its PostgreSQL databases dropped: the kit makes a hundred of them)
    ran: list[str] = []

    def close() -> None:
        for s in opened:
            s.close()
        if kind == "postgres":
            for url in dict.fromkeys(str(s.url) for s in opened):
                drop_database(url)
        opened.clear()

    try:
        for name in CHECKS:
            ran += await run_all(make_store, make_pair, checks=[name])
            close()
    finally:
        close()
    assert sorted(ran) == sorted(CHECKS)


async def test_conformance_kit_skips_admission_when_inner_lacks_it() -> None:
    from flowkit_testing.conformance import CHECKS, run_all

    ran = await run_all(lambda: CodecStore(NoneAdmitStore(), codec()))
    skipped = set(CHECKS) - set(ran)
    assert skipped and all("try_admit_singleton" in CHECKS[n].requires for n in skipped)
