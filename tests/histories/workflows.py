"""The workflows of the golden histories beside this file, and the scenarios that recorded them.

``tests/test_golden_histories.py`` replays every ``*.json`` here against this code, and checks
that together they hold every event type. The files are recorded once and then kept as they
are: they stand for runs that were in flight when the code changed, so a change to a
workflow here must still replay them. Recording them again is a deliberate act
(``FLOWKIT_RECORD_HISTORIES=1 pytest tests/test_golden_histories.py``); a ``TestEnv`` with a
fixed seed and its virtual clock makes it byte-stable, so only a real change shows in review.

A new event type needs a scenario here that records it (the coverage test fails until then)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from flowkit import (
    ChildWorkflowError,
    History,
    RetryPolicy,
    SignalTimeout,
    Singleton,
    WorkflowCtx,
    update_validator,
    workflow,
)
from flowkit_testing import TestEnv

SEED = 18
"""The seed of every recording's ``TestEnv`` (its clock starts at its default instant)."""


# -- the services the workflows call (only when recording: replay never runs a step) ----------
class Shop:
    def __init__(self) -> None:
        self.charges: Counter[str] = Counter()

    def reserve(self, order_id: str) -> str:
        return f"res-{order_id}"

    def charge(self, order_id: str) -> str:
        self.charges[order_id] += 1
        if self.charges[order_id] == 1:
            raise ConnectionError("card network busy")
        return f"ch-{order_id}"

    async def label(self, order_id: str, box: str) -> str:
        return f"{order_id}/{box}"


class Catalog:
    async def price(self, sku: str) -> int:
        return {"pen": 3, "desk": 1200}.get(sku, 10)


class Pager:
    def page(self, who: str) -> str:
        return f"paged {who}"


class Loader:
    def __init__(self) -> None:
        self.loads: Counter[str] = Counter()

    def header(self, batch: str) -> dict[str, Any]:
        return {"batch": batch, "columns": ["sku", "count"]}

    def load(self, batch: str) -> int:
        self.loads[batch] += 1
        if self.loads[batch] == 1:
            raise ValueError(f"batch {batch} is locked")
        return 42


class Worksite:
    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def work(self, job: str) -> str:
        await self.never.wait()  # runs until the run is cancelled
        return f"{job} done"

    def cleanup(self, job: str) -> str:
        return f"cleaned up {job}"


class Rollout:
    def push(self, env: str, build: str) -> str:
        return f"{build}@{env}"


class Biller:
    def quote(self, plan: str) -> int:
        return {"gold": 120}.get(plan, 60)

    def discounted_quote(self, plan: str) -> int:
        return self.quote(plan) * 9 // 10

    def bill(self, plan: str, cents: int) -> str:
        return f"{plan}: billed {cents}"


class Registry:
    """Its first lookup of a name never answers (an event nobody sets); later ones do."""

    def __init__(self) -> None:
        self.lookups: Counter[str] = Counter()
        self.never = asyncio.Event()

    async def lookup(self, name: str) -> str:
        self.lookups[name] += 1
        if self.lookups[name] == 1:
            await self.never.wait()
        return f"{name}.internal"


# -- the workflows ----------------------------------------------------------------------------
@workflow(name="order")
class Order:
    """Steps, a step retried after a backoff, a gather of two steps and a sleep, a sleep, and
    a signal waited for with a timeout that does not fire; the output uses ``ctx.now`` and
    ``ctx.uuid4``, so a replay checks that they come back the same."""

    def __init__(self, shop: Shop) -> None:
        self.shop = shop

    async def run(self, ctx: WorkflowCtx, order_id: str) -> dict[str, Any]:
        reservation = await ctx.step(self.shop.reserve, order_id)
        charge = await ctx.step(self.shop.charge, order_id, retry=RetryPolicy(initial_interval=5.0))
        first, second, _ = await ctx.gather(
            ctx.step(self.shop.label, order_id, "box-1"),
            ctx.step(self.shop.label, order_id, "box-2"),
            ctx.sleep(30),
        )
        await ctx.sleep(3600)  # the cooling-off hour
        approval = await ctx.wait_for_signal("approved", timeout=86400)
        return {
            "reservation": reservation,
            "charge": charge,
            "labels": [first, second],
            "approved_by": approval["by"],
            "ref": str(ctx.uuid4()),
            "at": ctx.now().isoformat(),
        }


@workflow(name="quote")
class Quote:
    """Big quotes wait an hour before they are sent (``tests/test_replayer.py`` changes that)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, ctx: WorkflowCtx, sku: str) -> int:
        price = await ctx.step(self.catalog.price, sku)
        if price > 1000:
            await ctx.sleep(3600)
        return price


@workflow(name="greeting")
class Greeting:
    """No ctx call at all."""

    async def run(self, ctx: WorkflowCtx, name: str) -> str:
        return f"hello {name}"


@workflow(name="reminder")
class Reminder:
    """A signal wait whose timeout fires, then a step."""

    def __init__(self, pager: Pager) -> None:
        self.pager = pager

    async def run(self, ctx: WorkflowCtx, who: str) -> str:
        try:
            await ctx.wait_for_signal("ack", timeout=600)
        except SignalTimeout:
            return await ctx.step(self.pager.page, who)
        return "acknowledged"


@workflow(name="import")
class Import:
    """A step that fails the run; ``engine.retry`` runs it again, and ``ctx.attempt`` says so."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    async def run(self, ctx: WorkflowCtx, batch: str) -> dict[str, Any]:
        header = await ctx.step(self.loader.header, batch)
        rows = await ctx.step(self.loader.load, batch)
        return {"header": header, "rows": rows, "attempt": ctx.attempt}


@workflow(name="job")
class Job:
    """Cancelled while in a step (``wait="step"``) or asleep (``wait="sleep"``): it cleans up
    with a step and lets the cancellation propagate."""

    def __init__(self, site: Worksite) -> None:
        self.site = site

    async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> str:
        job = input["job"]
        try:
            if input["wait"] == "step":
                return await ctx.step(self.site.work, job)
            await ctx.sleep(3600)
            return "slept"
        except asyncio.CancelledError:
            await ctx.step(self.site.cleanup, job)
            raise


@workflow(name="deploy", singleton=Singleton(key=lambda i: f"env:{i['env']}"))
class Deploy:
    """One deployment per environment at a time: a second one waits at the gate."""

    def __init__(self, rollout: Rollout) -> None:
        self.rollout = rollout

    async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> str:
        where = await ctx.step(self.rollout.push, input["env"], input["build"])
        await ctx.wait_for_signal("healthy")
        return f"{where} is live"


@workflow(name="renewal")
class RenewalV1:
    """The renewal before its patch: ``renewal-old`` was recorded by it, as a run in flight
    at a deploy is (and it finished on the patched code below)."""

    def __init__(self, biller: Biller) -> None:
        self.biller = biller

    async def run(self, ctx: WorkflowCtx, plan: str) -> str:
        cents = await ctx.step(self.biller.quote, plan)
        await ctx.sleep(86400)
        return await ctx.step(self.biller.bill, plan, cents)


@workflow(name="renewal")
class Renewal(RenewalV1):
    """Patched (``ctx.patched``): new runs get a discount, recorded with a ``patch_marker``;
    a run that had quoted before the deploy keeps its price."""

    async def run(self, ctx: WorkflowCtx, plan: str) -> str:
        if ctx.patched("discount"):
            cents = await ctx.step(self.biller.discounted_quote, plan)
        else:
            cents = await ctx.step(self.biller.quote, plan)
        await ctx.sleep(86400)
        return await ctx.step(self.biller.bill, plan, cents)


@workflow(name="lookup")
class Lookup:
    """A step bounded by a timeout: its first attempt times out (``StepTimeoutError``, a
    ``step_failed``), the retry answers."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def run(self, ctx: WorkflowCtx, name: str) -> str:
        return await ctx.step(
            self.registry.lookup, name, timeout=60, retry=RetryPolicy(initial_interval=5.0)
        )


class Ingest:
    def parse(self, file: str) -> int:
        return len(file)

    def cleanup(self, file: str) -> str:
        return f"removed {file}.partial"


@workflow(name="batch", execution_timeout=3600)
class Batch:
    """Its hour (``execution_timeout``) runs out during a day-long sleep: the deadline cancels
    it (``cancel_requested`` with ``reason="execution_timeout"``) and it cleans up."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    async def run(self, ctx: WorkflowCtx, file: str) -> int:
        try:
            await ctx.sleep(86400)
            return await ctx.step(self.ingest.parse, file)
        except asyncio.CancelledError:
            await ctx.step(self.ingest.cleanup, file)
            raise


@workflow(name="ingest", max_recovery_attempts=1)
class IngestFile:
    """Its worker dies in every activation: after one recovery it is ``dead``; retried with a
    new input, it completes."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest

    async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> int:
        return await ctx.step(self.ingest.parse, input["file"])


class Travel:
    """Bookings for the saga: the car is never available; the hotel's cancellation desk is
    busy the first time it is called."""

    def __init__(self) -> None:
        self.cancel_calls: Counter[str] = Counter()

    def book(self, what: str, trip: str) -> str:
        if what == "car":
            raise LookupError(f"no car left for {trip}")
        return f"{what}-{trip}"

    def cancel(self, booking: str) -> str:
        self.cancel_calls[booking] += 1
        if booking.startswith("hotel") and self.cancel_calls[booking] == 1:
            raise ConnectionError("hotel desk busy")
        return f"cancelled {booking}"


@workflow(name="trip")
class Trip:
    """A saga: flight, hotel and car are booked, each with its cancellation as compensation;
    the trip is paid within the hour. The car fails (the hotel and the flight are cancelled,
    in that order), or the run is cancelled with ``compensate=True`` while it waits."""

    def __init__(self, travel: Travel) -> None:
        self.travel = travel

    async def run(self, ctx: WorkflowCtx, trip: str) -> list[str]:
        undo = self.travel.cancel
        retry = RetryPolicy(max_attempts=3, initial_interval=2.0)
        flight = await ctx.step(self.travel.book, "flight", trip, compensate=undo, retry=retry)
        hotel = await ctx.step(self.travel.book, "hotel", trip, compensate=undo, retry=retry)
        await ctx.wait_for_signal("paid", timeout=3600)
        car = await ctx.step(self.travel.book, "car", trip, compensate=undo)
        return [flight, hotel, car]


class Billing:
    def bill(self, account: str, cycle: int) -> str:
        return f"{account}/{cycle}"


@workflow(name="subscription")
class Subscription:
    """Bills a cycle, waits for the next one and continues as new (``run_continued``): a loop
    whose every history stays one cycle long."""

    def __init__(self, billing: Billing) -> None:
        self.billing = billing

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> int:
        await ctx.step(self.billing.bill, input["account"], input["cycle"])
        await ctx.sleep(30 * 86400)
        if input["cycle"] < 1:
            ctx.continue_as_new({"account": input["account"], "cycle": input["cycle"] + 1})
        return int(input["cycle"])


@workflow(name="charge-card")
class ChargeCard:
    """A child: declines a large amount; waits a second for the bank."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> dict[str, int]:
        if input["amount"] > 1000:
            raise ValueError("declined")
        await ctx.sleep(1)
        return {"charged": input["amount"]}


@workflow(name="checkout")
class Checkout:
    """A parent (docs/composing-workflows.md "Children"): a child awaited in place, one started and
    awaited through its handle (it fails), and one that cannot start (invalid input)."""

    async def run(self, ctx: WorkflowCtx, input: str) -> dict[str, Any]:
        first = await ctx.child(ChargeCard, {"amount": 10})
        big = await ctx.start_child("charge-card", {"amount": 5000})
        try:
            await big.result()
            declined = ""
        except ChildWorkflowError as err:
            declined = type(err.cause).__name__
        try:
            await ctx.child("charge-card", {"amount": "ten"})
            invalid = False
        except ChildWorkflowError:
            invalid = True
        return {"first": first["charged"], "declined": declined, "invalid": invalid}


class Limit(BaseModel):
    """The argument of the ``approval`` workflow's ``raise`` update."""

    amount: int


@workflow(name="approval", updates={"raise": Limit})
class Approval:
    """Publishes its progress (``event_set``), takes an update (``update_received``) and
    answers it (``update_replied``)."""

    @update_validator("raise")
    def check_raise(self, arg: Limit) -> None:
        if arg.amount <= 0:
            raise ValueError("a raise must be positive")

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        ctx.set_event("limit", input)
        upd = await ctx.wait_for_update("raise", timeout=3600)
        limit = input + upd.arg.amount
        await upd.reply({"limit": limit})
        await ctx.set_event("limit", limit)
        return limit


@workflow(name="payment")
class Payment:
    """Two waits for published events (one matched by order id), the second with a timeout."""

    async def run(self, ctx: WorkflowCtx, order_id: str) -> dict[str, Any]:
        paid = await ctx.wait_for_event("payment.received", match={"order": order_id})
        try:
            shipped = await ctx.wait_for_event(
                "parcel.shipped", match={"order": order_id}, timeout=3600
            )
        except SignalTimeout:
            shipped = None
        return {"paid": paid["amount"], "shipped": shipped is not None}


@workflow(name="shipment")
class Shipment:
    """Search attributes (docs/search-and-retention.md): one upsert awaited, one riding with the
    next write."""

    async def pack(self, order: str) -> str:
        return f"box-{order}"

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        await ctx.upsert_search(stage="packing", priority=2)
        box = await ctx.step(self.pack, input)
        ctx.upsert_search(stage="shipped", express=True, weight=1.5)
        await ctx.sleep(60)
        return box


def workflows() -> list[Any]:
    """The workflows as a worker registers them (and as ``replay_dir`` takes them)."""
    return [
        Order(Shop()),
        Quote(Catalog()),
        Greeting(),
        Reminder(Pager()),
        Import(Loader()),
        Job(Worksite()),
        Deploy(Rollout()),
        Renewal(Biller()),
        Lookup(Registry()),
        Batch(Ingest()),
        IngestFile(Ingest()),
        Trip(Travel()),
        Subscription(Billing()),
        ChargeCard(),
        Checkout(),
        Approval(),
        Payment(),
        Shipment(),
    ]


# -- the scenarios: each drives a fresh TestEnv and names the runs whose histories it keeps ---
Scenario = Callable[[TestEnv], Awaitable[list[str]]]


async def order(env: TestEnv) -> list[str]:
    await env.start("order", "o-1", "order-1")
    await env.advance(4000)  # the retry, the gather's sleep, the cooling-off hour
    await env.signal("order-1", "approved", {"by": "ann"})
    await env.result("order-1")
    return ["order-1"]


async def quotes(env: TestEnv) -> list[str]:
    for run_id, sku in (("quote-pen", "pen"), ("quote-desk", "desk")):
        await env.start("quote", sku, run_id)
        await env.result(run_id)
    await env.start("quote", "desk", "quote-live")  # still in its hour when recorded
    return ["quote-pen", "quote-desk", "quote-live"]


async def greeting(env: TestEnv) -> list[str]:
    await env.start("greeting", "Ann", "greeting-ann")
    await env.result("greeting-ann")
    return ["greeting-ann"]


async def reminder(env: TestEnv) -> list[str]:
    await env.start("reminder", "ops", "reminder-1")
    await env.result("reminder-1")
    return ["reminder-1"]


async def import_retried(env: TestEnv) -> list[str]:
    await env.start("import", "b-7", "import-1")
    await env.run_until_idle()  # failed
    await env.advance(60)
    await env.retry("import-1")
    await env.result("import-1")
    return ["import-1"]


async def cancelled(env: TestEnv) -> list[str]:
    for wait in ("step", "sleep"):
        run_id = f"job-cancelled-in-{wait}"
        await env.start("job", {"job": f"j-{wait}", "wait": wait}, run_id)
        await env.advance(10)
        await env.cancel(run_id)
        await env.run_until_idle()
    return ["job-cancelled-in-step", "job-cancelled-in-sleep"]


async def cancelled_while_down(env: TestEnv) -> list[str]:
    """Cancelled while its worker is dead: the recovered body gets the cancellation at its
    first step the history does not answer, recorded as cancelled before it started."""
    await env.start("job", {"job": "j-down", "wait": "step"}, "job-cancelled-while-down")
    await env.advance(10)
    await env.crash(0)
    await env.restart(0)
    await env.cancel("job-cancelled-while-down")
    await env.run_until_idle()  # its lease expires; the new worker recovers it
    return ["job-cancelled-while-down"]


async def deploys(env: TestEnv) -> list[str]:
    await env.start("deploy", {"env": "prod", "build": "b-1"}, "deploy-1")
    await env.advance(5)
    await env.start("deploy", {"env": "prod", "build": "b-2"}, "deploy-2")  # gated
    await env.advance(60)
    await env.signal("deploy-1", "healthy")  # done: its slot goes to deploy-2
    await env.advance(5)
    await env.signal("deploy-2", "healthy")
    await env.run_until_idle()
    return ["deploy-1", "deploy-2"]


async def patched_deploy(env: TestEnv) -> list[str]:
    """A run of ``RenewalV1`` in flight when the patched ``Renewal`` is deployed, and a run
    started after: the first finishes on the old branch, the second takes the patch."""
    env.workflows = [RenewalV1(Biller())]
    await env.restart(0)
    await env.start("renewal", "gold", "renewal-old")
    await env.advance(60)
    env.workflows = workflows()
    await env.restart(0)
    await env.start("renewal", "gold", "renewal-new")
    await env.run_until_idle()
    return ["renewal-old", "renewal-new"]


async def lookup_timed_out(env: TestEnv) -> list[str]:
    await env.start("lookup", "db", "lookup-1")
    await env.result("lookup-1")  # virtual time: the attempt's 60 s, the 5 s backoff
    return ["lookup-1"]


async def timed_out(env: TestEnv) -> list[str]:
    await env.start("batch", "day.csv", "batch-timed-out")
    await env.run_until_idle()  # the hour is up long before the day's sleep
    return ["batch-timed-out"]


async def dead_then_retried(env: TestEnv) -> list[str]:
    """A poison run: instance 0 dies recording its step, twice; the claim of the second
    recovery finds it past ``max_recovery_attempts`` and it goes ``dead``. Retried with a new
    input (the cause fixed: no more crashes), it completes."""
    rule = env.crash_at(0, "before_step_record", times=None)
    await env.start("ingest", {"file": "huge.csv"}, "ingest-1")
    while (await env.store.get_run("ingest-1")).status.active:
        if env.crashed:
            await env.restart(0)
        else:
            await env.run_until_idle()  # the dead worker's lease expires: recovered
    rule.times = rule.fired
    await env.advance(60)
    await env.retry("ingest-1", input={"file": "small.csv"})
    await env.result("ingest-1")
    return ["ingest-1"]


async def sagas(env: TestEnv) -> list[str]:
    """``trip-1``: paid, then the car fails: the hotel's cancellation fails once and is
    retried, then the flight's runs. ``trip-cancelled``: cancelled with ``compensate=True``
    while it waits to be paid: both bookings are cancelled, the hotel's after a retry."""
    await env.start("trip", "t1", "trip-1")
    await env.advance(60)
    await env.signal("trip-1", "paid")
    await env.run_until_idle()
    await env.start("trip", "t2", "trip-cancelled")
    await env.advance(60)
    await env.cancel("trip-cancelled", compensate=True)
    await env.run_until_idle()
    return ["trip-1", "trip-cancelled"]


async def subscription(env: TestEnv) -> list[str]:
    """Two cycles: the first run continues as new, its successor ends the chain."""
    await env.start("subscription", {"account": "acme", "cycle": 0}, "subscription-1")
    await env.result("subscription-1")  # (followed to the chain's last run)
    return ["subscription-1", "subscription-1~1"]


async def checkout(env: TestEnv) -> list[str]:
    """A parent with three children: completed, failed, never started."""
    await env.start("checkout", "cart-1", "checkout-1")
    await env.run_until_idle()
    await env.result("checkout-1")
    return ["checkout-1"]


async def approval(env: TestEnv) -> list[str]:
    """A published value, a rejected update (nothing recorded), an update and its reply."""
    await env.start("approval", 100, "approval-1")
    eng = env.engines[0]
    try:
        await eng.update("approval-1", "raise", {"amount": -5})
    except Exception as exc:  # UpdateRejectedError
        assert type(exc).__name__ == "UpdateRejectedError", exc
    task = asyncio.ensure_future(eng.update("approval-1", "raise", {"amount": 50}))
    await env.run_until_idle()
    assert await task == {"limit": 150}
    await env.result("approval-1")
    return ["approval-1"]


async def payments(env: TestEnv) -> list[str]:
    """One event buffered before its waiter parks, one delivered to a parked waiter, and a
    wait that times out."""
    await env.publish_event("payment.received", {"order": "p-1", "amount": 30}, event_id="e-1")
    await env.start("payment", "p-1", "payment-1")
    await env.publish_event("parcel.shipped", {"order": "p-1"}, event_id="e-2")
    await env.result("payment-1")
    await env.start("payment", "p-2", "payment-late")
    await env.publish_event("payment.received", {"order": "p-2", "amount": 5}, event_id="e-3")
    await env.result("payment-late")  # (its parcel never ships: the hour passes)
    return ["payment-1", "payment-late"]


async def shipment(env: TestEnv) -> list[str]:
    """Search attributes set at start and upserted twice (``search_upserted``)."""
    await env.start("shipment", "o-9", "shipment-1", search={"customer": "c-9"})
    await env.run_until_idle()
    await env.result("shipment-1")
    return ["shipment-1"]


class _FixedTrace:
    """A telemetry (``flowkit._core.telemetry.Telemetry``) that carries one fixed trace context
    and observes nothing: the stand-in of ``flowkit.otel`` for a recorded ``run_started``
    with its trace context in its tags (no OpenTelemetry needed to record or replay it)."""

    TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}

    def start_context(self, workflow: str, run_id: str) -> dict[str, str]:
        return dict(self.TRACE)

    def run_started(self, workflow: str, run_id: str, created: bool) -> None: ...

    def activation(self, run_id: str, workflow: str, attempt: int, trace: Any) -> Any:
        return self

    def step(self, name: str, attempt: int) -> Any:
        return self

    def end(self, *args: Any) -> None: ...

    def settled(self, workflow: str, status: str) -> None: ...

    def admitted(self, workflow: str, key: str, waited: float) -> None: ...

    def lease_lost(self, workflow: str | None) -> None: ...


async def traced(env: TestEnv) -> list[str]:
    """A run started inside a caller's trace (``flowkit.otel``): its ``run_started`` carries
    the trace context."""
    env.engines[0].config.telemetry = _FixedTrace()
    await env.start("greeting", "Bo", "greeting-traced")
    await env.result("greeting-traced")
    env.engines[0].config.telemetry = None
    return ["greeting-traced"]


SCENARIOS: tuple[Scenario, ...] = (
    order,
    traced,
    quotes,
    greeting,
    reminder,
    import_retried,
    cancelled,
    cancelled_while_down,
    deploys,
    patched_deploy,
    lookup_timed_out,
    timed_out,
    dead_then_retried,
    sagas,
    subscription,
    checkout,
    approval,
    payments,
    shipment,
)


async def record() -> dict[str, History]:
    """Every scenario's runs, by run id (a file ``<run id>.json`` each)."""
    recorded: dict[str, History] = {}
    for scenario in SCENARIOS:
        async with TestEnv(workflows(), seed=SEED) as env:
            for run_id in await scenario(env):
                assert run_id not in recorded, f"two scenarios record {run_id!r}"
                recorded[run_id] = await env.history(run_id)
    return recorded
