"""Published events (docs/events.md): ``engine.publish_event`` / ``ctx.wait_for_event(match=...)``
/ ``@workflow(on_event=...)`` on every store (MemoryStore, a SQLite file, PostgreSQL), with
several ``TestEnv`` instances: fan-out, buffering, dedupe, timeouts, ``on_event`` starts, the
race between a publish and a waiter about to park, and crashes around both."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from flowkit import (
    Engine,
    InvalidInputError,
    NonDeterminismError,
    SignalTimeout,
    WorkflowCtx,
    replay_async,
    workflow,
)
from flowkit.events import EventReceived
from flowkit.stores.base import PublishedEvent
from flowkit.stores.codec import CodecStore
from flowkit.stores.memory import MemoryStore
from flowkit_testing import TestEnv
from flowkit_testing._faults import Rule

EV = "payment.received"


@workflow(name="order")
class Order:
    async def run(self, ctx: WorkflowCtx, order_id: str) -> Any:
        return await ctx.wait_for_event(EV, match={"order": order_id})


@workflow(name="patient")
class Patient:
    """Waits ten minutes for its payment, then says it timed out."""

    async def run(self, ctx: WorkflowCtx, order_id: str) -> Any:
        try:
            return await ctx.wait_for_event(EV, match={"order": order_id}, timeout=600)
        except SignalTimeout:
            return "timed out"


class Paid(BaseModel):
    order: str
    amount: int


@workflow(name="receipt", on_event=EV)
class Receipt:
    async def run(self, ctx: WorkflowCtx, paid: Paid) -> str:
        return f"receipt {paid.order} {paid.amount}"


def received(events: list[Any]) -> list[EventReceived]:
    return [e for e in events if isinstance(e, EventReceived)]


async def test_fan_out_to_every_matching_waiter(backend: Any) -> None:
    async with TestEnv([Order()], store=backend.store, instances=2) as env:
        for rid, order in (("a1", "a"), ("a2", "a"), ("b1", "b")):
            await env.start("order", order, rid)
        await env.run_until_idle()
        done = await env.publish_event(EV, {"order": "a", "amount": 3}, event_id="pay-a")
        assert isinstance(done, PublishedEvent)
        assert sorted(done.delivered) == ["a1", "a2"] and not done.buffered
        for rid in ("a1", "a2"):
            assert await env.result(rid) == {"order": "a", "amount": 3}
            (ev,) = received(list(await env.history(rid)))
            assert (ev.name, ev.event_id) == (EV, "pay-a")
        assert (await env.get_run("b1")).status.value == "suspended"
        await env.publish_event(EV, {"order": "b", "amount": 1}, event_id="pay-b")
        assert await env.result("b1") == {"order": "b", "amount": 1}


async def test_an_unmatched_event_is_buffered_once_for_the_first_later_waiter(
    backend: Any,
) -> None:
    async with TestEnv([Order()], store=backend.store, instances=2) as env:
        done = await env.publish_event(EV, {"order": "x", "amount": 9}, event_id="early")
        assert done.buffered and done.delivered == ()
        await env.start("order", "y", "other")  # (does not match: leaves it buffered)
        await env.start("order", "x", "first")
        await env.start("order", "x", "second")
        await env.run_until_idle()
        assert await env.result("first") == {"order": "x", "amount": 9}
        assert (await env.get_run("second")).status.value == "suspended"
        assert (await env.get_run("other")).status.value == "suspended"
        await env.publish_event(EV, {"order": "x", "amount": 10}, event_id="late")
        assert await env.result("second") == {"order": "x", "amount": 10}


async def test_an_event_id_is_published_once(backend: Any) -> None:
    async with TestEnv([Order()], store=backend.store) as env:
        first = await env.publish_event(EV, {"order": "x", "amount": 1}, event_id="same")
        again = await env.publish_event(EV, {"order": "x", "amount": 2}, event_id="same")
        assert first.buffered and not first.duplicate
        assert again.duplicate and not again.buffered and again.delivered == ()
        await env.start("order", "x", "o1")
        await env.start("order", "x", "o2")
        await env.run_until_idle()
        assert await env.result("o1") == {"order": "x", "amount": 1}
        assert (await env.get_run("o2")).status.value == "suspended"  # (nothing else came)


async def test_generated_event_ids_are_deterministic_under_test_env() -> None:
    ids = []
    for _ in range(2):
        async with TestEnv([Order()], seed=7) as env:
            done = await env.publish_event(EV, {"order": "x"})
            ids.append(done.event_id)
    assert ids[0] == ids[1] and ids[0]


async def test_a_timed_out_waiter_no_longer_receives(backend: Any) -> None:
    async with TestEnv([Patient()], store=backend.store) as env:
        await env.start("patient", "p", "slow")
        await env.advance(601)
        assert await env.result("slow") == "timed out"
        done = await env.publish_event(EV, {"order": "p", "amount": 1}, event_id="too-late")
        assert done.buffered and done.delivered == ()  # (not lost: kept for a later waiter)
        types = (await env.history("slow")).types
        assert "timer_fired" in types and "event_received" not in types


async def test_an_event_published_as_the_timeout_falls_due_is_received_not_lost(
    backend: Any,
) -> None:
    """The timeout's last take is exclusive with a delivery: an event buffered or delivered by
    the time the timer fires is received instead of the timeout."""
    async with TestEnv([Patient()], store=backend.store) as env:
        await env.start("patient", "p", "edge")
        await env.advance(599)
        eng = env.engines[0]
        env.clock.advance(1)  # (the timer is due now; no worker has looked yet)
        done = await eng.publish_event(EV, {"order": "p", "amount": 2}, event_id="edge")
        assert done.delivered == ("edge",)
        assert await env.result("edge") == {"order": "p", "amount": 2}


async def test_on_event_starts_one_run_per_event(backend: Any) -> None:
    async with TestEnv([Order(), Receipt()], store=backend.store, instances=3) as env:
        await env.start("order", "z", "waiter")
        done = await env.publish_event(EV, {"order": "z", "amount": 4}, event_id="e1")
        assert done.started == ("evt:e1:receipt",)
        again = await env.engines[1].publish_event(EV, {"order": "z", "amount": 4}, event_id="e1")
        assert again.duplicate and again.started == ("evt:e1:receipt",)
        assert await env.result("evt:e1:receipt") == "receipt z 4"
        assert await env.result("waiter") == {"order": "z", "amount": 4}
        runs = await env.engines[2].list_runs(workflow="receipt")
        assert [r.id for r in runs] == ["evt:e1:receipt"]


async def test_on_event_from_many_engines_at_once_starts_one_run(backend: Any) -> None:
    import asyncio

    async with TestEnv([Receipt()], store=backend.store, instances=3, seed=3) as env:
        outs = await asyncio.gather(
            *(e.publish_event(EV, {"order": "q", "amount": 1}, event_id="e9") for e in env.engines)
        )
        await env.run_until_idle()
        assert sum(not o.duplicate for o in outs) == 1
        assert [r.id for r in await env.engines[0].list_runs(workflow="receipt")] == [
            "evt:e9:receipt"
        ]


async def test_an_on_event_input_it_refuses_does_not_lose_the_delivery(backend: Any) -> None:
    async with TestEnv([Order(), Receipt()], store=backend.store) as env:
        await env.start("order", "w", "waiter")
        done = await env.publish_event(EV, {"order": "w"}, event_id="no-amount")
        assert done.delivered == ("waiter",) and done.started == ()
        assert await env.result("waiter") == {"order": "w"}
        assert await env.engines[0].list_runs(workflow="receipt") == []


@pytest.mark.parametrize(
    ("name", "payload", "event_id"),
    [("", 1, None), ("a\x00b", 1, None), (EV, float("nan"), None), (EV, 1, ""), (EV, 1, "x" * 300)],
)
async def test_bad_input_is_refused_and_writes_nothing(
    backend: Any, name: str, payload: Any, event_id: str | None
) -> None:
    async with TestEnv([Order()], store=backend.store) as env:
        with pytest.raises(InvalidInputError):
            await env.publish_event(name, payload, event_id=event_id)
        await env.start("order", "x", "o")
        await env.run_until_idle()
        assert (await env.get_run("o")).status.value == "suspended"


async def test_an_event_id_too_long_for_its_on_event_run_id_is_refused() -> None:
    async with TestEnv([Order(), Receipt()]) as env:
        with pytest.raises(InvalidInputError):
            await env.publish_event(EV, {"order": "o", "amount": 1}, event_id="x" * 250)
        await env.start("order", "o", "o")
        await env.run_until_idle()
        assert (await env.get_run("o")).status.value == "suspended"  # (nothing was written)


async def test_payload_size_is_bounded_like_signals() -> None:
    async with Engine(MemoryStore(), [Order()], max_payload_bytes=100) as eng:
        with pytest.raises(InvalidInputError):
            await eng.publish_event(EV, {"order": "x" * 200})


@pytest.mark.parametrize("seed", range(12))
async def test_a_publish_racing_a_waiter_about_to_park_is_never_lost(
    backend: Any, seed: int
) -> None:
    """Instances interleave as the seed decides: waiters start (register, park) while other
    instances publish their events; every waiter gets its own event exactly once."""
    import asyncio

    async with TestEnv([Order()], store=backend.store, instances=3, seed=seed) as env:
        n = 6
        starts = [env.engines[0].start("order", f"k{i}", f"w{i}") for i in range(n)]
        pubs = [
            env.engines[1 + i % 2].publish_event(EV, {"order": f"k{i}"}, event_id=f"e{i}")
            for i in range(n)
        ]
        await asyncio.gather(*starts, *pubs)
        await env.run_until_idle()
        for i in range(n):
            assert await env.result(f"w{i}") == {"order": f"k{i}"}
            (ev,) = received(list(await env.history(f"w{i}")))
            assert ev.event_id == f"e{i}"
        await env.start("order", "k0", "late")  # (nothing left in the buffer for it)
        await env.run_until_idle()
        assert (await env.get_run("late")).status.value == "suspended"


@pytest.mark.parametrize("phase", ["before", "after"])
async def test_a_crash_around_the_take_receives_the_event_once(backend: Any, phase: str) -> None:
    async with TestEnv([Order()], store=backend.store, instances=2, seed=1) as env:
        await env.publish_event(EV, {"order": "c"}, event_id="e1")
        env.inject(Rule("take_event", "crash", phase, instance=0))
        env.inject(Rule("take_event", "crash", phase, instance=1))
        await env.start("order", "c", "crashy")
        await env.advance(120)  # (the crashed instance's lease expires)
        for i in env.crashed:
            await env.restart(i)
        assert await env.result("crashy") == {"order": "c"}
        assert len(received(list(await env.history("crashy")))) == 1
        await env.start("order", "c", "second")
        await env.run_until_idle()
        assert (await env.get_run("second")).status.value == "suspended"


@pytest.mark.parametrize("phase", ["before", "after"])
async def test_a_crash_around_the_publish_delivers_once(backend: Any, phase: str) -> None:
    from flowkit_testing._faults import InstanceCrashed

    async with TestEnv([Order()], store=backend.store, instances=2, seed=2) as env:
        await env.start("order", "d", "waiter")
        await env.run_until_idle()
        env.inject(Rule("publish_event", "crash", phase, instance=0))
        with pytest.raises(InstanceCrashed):
            await env.engines[0].publish_event(EV, {"order": "d"}, event_id="e1")
        await env.restart(0)
        again = await env.publish_event(EV, {"order": "d"}, event_id="e1")  # (the retry)
        assert again.duplicate is (phase == "after")
        assert await env.result("waiter") == {"order": "d"}
        assert len(received(list(await env.history("waiter")))) == 1


async def test_codec_store_encrypts_event_payloads_at_rest() -> None:
    from flowkit.stores.codec import AESGCMCodec

    inner = MemoryStore()
    store = CodecStore(inner, AESGCMCodec([("k1", b"k" * 32)]))
    async with TestEnv([Order()], store=store) as env:
        await env.publish_event(EV, {"order": "s", "secret": "pin-1234"}, event_id="e1")
        (buffered,) = inner._d.events_data.buffer
        assert "pin-1234" not in repr(buffered.payload)
        await env.start("order", "s", "sealed")
        assert await env.result("sealed") == {"order": "s", "secret": "pin-1234"}
        (ev,) = received(await inner.load_events("sealed"))
        assert "pin-1234" not in repr(ev.payload)


async def test_replay_matches_event_received_and_diverges_on_another_name() -> None:
    @workflow(name="order")
    class Renamed:
        async def run(self, ctx: WorkflowCtx, order_id: str) -> Any:
            return await ctx.wait_for_event("refund.issued", match={"order": order_id})

    async with TestEnv([Order()]) as env:
        await env.publish_event(EV, {"order": "r"}, event_id="e1")
        await env.start("order", "r", "r1")
        await env.result("r1")
        history = await env.history("r1")
    await replay_async(history, Order())  # (raises on a divergence)
    with pytest.raises(NonDeterminismError, match=r"refund\.issued"):
        await replay_async(history, Renamed())


async def test_wait_for_event_checks_its_arguments() -> None:
    @workflow(name="picky")
    class Picky:
        async def run(self, ctx: WorkflowCtx, how: str) -> str:
            args: dict[str, Any] = {
                "name": {"name": ""},
                "match": {"name": EV, "match": ["order"]},
                "timeout": {"name": EV, "timeout": -1},
            }[how]
            try:
                ctx.wait_for_event(**args)
            except ValueError as exc:
                return f"refused: {exc}"
            return "accepted"

    async with TestEnv([Picky()]) as env:
        for how in ("name", "match", "timeout"):
            await env.start("picky", how, how)
            assert (await env.result(how)).startswith("refused")


async def test_a_take_cannot_slip_into_a_publish_in_flight(sql_backend: Any) -> None:
    """Real transactions: while a publish (no waiter yet) is inside its transaction, a waiter
    registering from another connection and thread must wait for it, and then take the event
    from the buffer; without the per-name serialization it would register, find no event,
    and the event would be buffered for nobody."""
    import asyncio
    import threading

    from flowkit._core.event_keys import match_keys, payload_keys
    from flowkit.stores.sql import SqlStore
    from flowkit.stores.sql import _events as sql_events

    try:
        from store_kit import T0, mk
    except ImportError:  # (tests/ imported as a package)
        from tests.store_kit import T0, mk

    url = sql_backend.url
    pub, sub = SqlStore(url, group_commit=False), SqlStore(url, group_commit=False)
    try:
        await pub.create_run(mk("w"), [])
        taken: list[Any] = []
        finished_inside = threading.Event()

        def take() -> None:
            coro = sub.take_event("w", "1", EV, match_keys({"order": "o"}), T0 + 1)
            taken.append(asyncio.run(coro))
            finished_inside.set()

        worker = threading.Thread(target=take)
        real = sql_events.PublishedEvent

        def inside(*args: Any, **kw: Any) -> Any:
            # (the publish's transaction is open, its buffer row not committed)
            if not worker.is_alive() and not taken:
                worker.start()
                finished_inside.wait(timeout=1.0)  # (a bounded look: it must still block)
            return real(*args, **kw)

        sql_events.PublishedEvent = inside  # type: ignore[misc]
        try:
            payload = {"order": "o"}
            await asyncio.to_thread(
                lambda: asyncio.run(pub.publish_event(EV, payload, "e1", payload_keys(payload), T0))
            )
        finally:
            sql_events.PublishedEvent = real  # type: ignore[misc]
        worker.join()
        assert taken and taken[0] is not None and taken[0].event_id == "e1"
    finally:
        pub.close()
        sub.close()


def test_flowkit_history_prints_event_received() -> None:
    from flowkit.cli._out import EVENT_STYLE, _describe

    ev = EventReceived(pos="2", name=EV, event_id="pay-1", payload={"order": "o"}, at=10.0)
    assert _describe(ev, 0.0) == 'payment.received (pay-1) payload {"order":"o"}'
    assert EVENT_STYLE["event_received"] == "cyan"


PUBLISHER = """
import asyncio, json, sys
from pydantic import BaseModel
from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import SqlStore

class Paid(BaseModel):
    order: str
    amount: int

@workflow(name="receipt", on_event="payment.received")
class Receipt:
    async def run(self, ctx: WorkflowCtx, paid: Paid) -> str:
        return "receipt"

async def main() -> None:
    engine = Engine(SqlStore(sys.argv[1]), [Receipt()], worker=False)
    out = []
    for i in range(5):
        done = await engine.publish_event(
            "payment.received", {"order": f"o{i}", "amount": i}, event_id=f"e{i}"
        )
        out.append([done.duplicate, list(done.started)])
    print(json.dumps(out))

asyncio.run(main())
"""


def test_processes_publishing_the_same_events_start_one_run_each(sql_backend: Any) -> None:
    """Three processes publish the same five event ids at once: each id is published (not a
    duplicate) by exactly one of them, and each ``on_event`` run exists once."""
    import asyncio
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, sql_backend.url],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout))
    for i in range(5):
        assert sum(not out[i][0] for out in outs) == 1
        assert all(out[i][1] == [f"evt:e{i}:receipt"] for out in outs)
    runs = asyncio.run(sql_backend.store.list_runs(workflow="receipt"))
    assert sorted(r.id for r in runs) == [f"evt:e{i}:receipt" for i in range(5)]


def digests_at_rest(backend: Any) -> list[dict[str, str]]:
    """The digests a store holds in clear: its buffered events' ``keys`` and its registered
    waits' ``match``."""
    if backend.url is None:
        ed = backend.store._d.events_data
        return [b.keys for b in ed.buffer] + [w.match for w in ed.waits.values()]
    import json

    import sqlalchemy as sa

    engine = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = [
                *conn.execute(sa.text("SELECT keys FROM flowkit_event_buffer")),
                *conn.execute(sa.text("SELECT match FROM flowkit_event_waits")),
            ]
    finally:
        engine.dispose()
    return [r[0] if isinstance(r[0], dict) else json.loads(r[0]) for r in rows]


async def test_codec_store_keys_the_digests_events_are_matched_on(backend: Any) -> None:
    """Through an ``AESGCMCodec``, the digests in clear are keyed: whoever reads the database
    cannot check guessed values against them (an unsalted SHA-256 gave a salary away in a
    loop of 500 guesses); matching works as before."""
    import hashlib

    from flowkit._core.event_keys import value_digest
    from flowkit._core.serde import dumps
    from flowkit.stores.codec import AESGCMCodec

    store = CodecStore(backend.store, AESGCMCodec([("k1", b"k" * 32)]))
    async with TestEnv([Order()], store=store) as env:
        payload = {"employee": "alice", "salary": 185000, "order": "o-7"}
        await env.publish_event("salary.set", payload, event_id="e1")
        await env.start("order", "o-9", "other")  # (registered: its match is at rest too)
        await env.run_until_idle()
        buffered, waiting = digests_at_rest(backend)
        assert set(buffered) == {"employee", "salary", "order"} and set(waiting) == {"order"}
        # the brute force of the review: every candidate's plain digest, as stored before
        guesses = {hashlib.sha256(dumps(s)).hexdigest()[:32]: s for s in range(0, 500_001, 1000)}
        assert buffered["salary"] not in guesses and value_digest(185000) in guesses
        assert buffered["employee"] != value_digest("alice")
        assert waiting["order"] != value_digest("o-9")
        # both sides are keyed alike: a matching waiter still takes it from the buffer
        await env.publish_event(EV, {"order": "o-9", "amount": 1}, event_id="e2")
        assert await env.result("other") == {"order": "o-9", "amount": 1}


async def test_keyed_digests_survive_key_rotation() -> None:
    """The MAC key comes from the first key: appending keys keeps the digests (an event
    buffered before the rotation still matches), dropping the first one changes them."""
    from flowkit.stores.codec import AESGCMCodec

    k1, k2 = b"1" * 32, b"2" * 32
    old, rotated, dropped = (
        AESGCMCodec([("k1", k1)]),
        AESGCMCodec([("k1", k1), ("k2", k2)]),
        AESGCMCodec([("k2", k2)]),
    )
    assert old.keyed_digest(b"v") == rotated.keyed_digest(b"v") != dropped.keyed_digest(b"v")
    assert old.keyed_digest(b"v") != old.keyed_digest(b"w")
    inner = MemoryStore()
    async with TestEnv([Order()], store=CodecStore(inner, old)) as env:
        await env.publish_event(EV, {"order": "r", "amount": 5}, event_id="e1")
    async with TestEnv([Order()], store=CodecStore(inner, rotated)) as env:
        await env.start("order", "r", "after-rotation")
        assert await env.result("after-rotation") == {"order": "r", "amount": 5}


async def test_a_codec_without_keyed_digest_leaves_the_digests_plain() -> None:
    from flowkit._core.event_keys import payload_keys

    class Plain:
        def encode(self, value: Any) -> Any:
            return {"wrapped": value}

        def decode(self, value: Any) -> Any:
            return value["wrapped"]

    inner = MemoryStore()
    async with TestEnv([Order()], store=CodecStore(inner, Plain())) as env:
        await env.publish_event(EV, {"order": "p"}, event_id="e1")
        (buffered,) = inner._d.events_data.buffer
        assert buffered.keys == payload_keys({"order": "p"})
        await env.start("order", "p", "plain")
        assert await env.result("plain") == {"order": "p"}
