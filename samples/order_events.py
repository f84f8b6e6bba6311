"""order_events: orders that wait for their payment, a published event matched by order id.

Each ``Order`` run waits for the event ``payment.received`` whose payload's ``order`` is its
own id (``ctx.wait_for_event(..., match=...)``), with a timeout. The payment service publishes
events with ``engine.publish_event``: one before its order's run even started (it is buffered
for the first matching waiter), the others while their orders wait (delivered at once), one of
them twice with the same ``event_id`` (delivered once). ``Receipt`` is an ``on_event``
workflow: one run per published payment, whatever the duplicates.

It runs on the real ``Engine`` over a SQLite file in a temporary directory and checks its own
claims at the end.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from pydantic import BaseModel

from flowkit import Engine, SignalTimeout, WorkflowCtx, workflow
from flowkit.stores import SqlStore

PAID = "payment.received"


class Payment(BaseModel):
    order: str
    amount: int


@workflow(name="order")
class Order:
    async def run(self, ctx: WorkflowCtx, order_id: str) -> str:
        try:
            paid = await ctx.wait_for_event(PAID, match={"order": order_id}, timeout=3600)
        except SignalTimeout:
            return f"{order_id}: no payment within the hour"
        return f"{order_id}: paid {paid['amount']}"


@workflow(name="receipt", on_event=PAID)
class Receipt:
    async def run(self, ctx: WorkflowCtx, payment: Payment) -> str:
        return f"receipt for {payment.order}"


async def main(db: Path) -> None:
    async with Engine(SqlStore(f"sqlite:///{db}"), [Order(), Receipt()]) as engine:
        # paid before its order's run started: buffered for the first matching waiter
        early = await engine.publish_event(PAID, {"order": "o-1", "amount": 30}, event_id="pay-1")
        print(f"pay-1: delivered to {list(early.delivered)}, buffered {early.buffered}")
        for order_id in ("o-1", "o-2", "o-3"):
            await engine.start("order", order_id, order_id)
        print(await engine.result("o-1", timeout=10))

        # o-2 waits (parked) by now: delivered at once; the retry of the same id is a no-op
        for _ in range(1000):  # (up to ten seconds)
            if (await engine.get_run("o-2")).status.value == "suspended":
                break
            await asyncio.sleep(0.01)
        late = await engine.publish_event(PAID, {"order": "o-2", "amount": 12}, event_id="pay-2")
        again = await engine.publish_event(PAID, {"order": "o-2", "amount": 12}, event_id="pay-2")
        print(f"pay-2: delivered to {list(late.delivered)}; again: duplicate {again.duplicate}")
        print(await engine.result("o-2", timeout=10))

        receipts = sorted(r.id for r in await engine.list_runs(workflow="receipt"))
        print(f"receipts: {receipts}")
        history = await engine.history("o-2")
        assert early.buffered and late.delivered == ("o-2",) and again.duplicate
        assert receipts == ["evt:pay-1:receipt", "evt:pay-2:receipt"]
        assert history.types.count("event_received") == 1
        assert (await engine.get_run("o-3")).status.value == "suspended"  # (still waits)
        print("ok: each payment reached its order once, buffered or delivered")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(Path(tmp) / "orders.db"))
