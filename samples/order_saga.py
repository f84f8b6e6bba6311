"""order_saga: an order built from two child workflows, undone when the second one fails.

``order`` reserves stock (a step whose undo puts it back), then starts two child workflows:
``payment`` charges the card (the parent records the charge with a step whose undo refunds
it), and ``shipping`` books a courier, which fails for an address no courier serves. The
child's failure reaches the parent as a ``ChildWorkflowError``; the parent lets it out, so the
recorded compensations run in reverse order (the refund, then the stock put back), each as a
durable step, and the order settles ``failed``. A second order to a served address completes.

Everything runs on an embedded SQLite file; run it with ``python samples/order_saga.py``.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from pydantic import BaseModel

from flowkit import ChildWorkflowError, Engine, WorkflowCtx, WorkflowFailedError, workflow
from flowkit.stores import SqlStore


class Order(BaseModel):
    id: str
    item: str
    cents: int
    address: str


class Shop:
    """The services the workflows call (in a real system: HTTP clients, a database)."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def reserve(self, order: Order) -> str:
        self.log.append(f"reserved {order.item} for {order.id}")
        return f"stock-{order.id}"

    def put_back(self, reservation: str) -> None:
        self.log.append(f"put back {reservation}")

    def charge(self, order: Order) -> str:
        self.log.append(f"charged {order.cents} cents for {order.id}")
        return f"charge-{order.id}"

    def refund(self, charge: str) -> None:
        self.log.append(f"refunded {charge}")

    def book_courier(self, order: Order) -> str:
        if order.address.startswith("Atlantis"):
            raise ValueError(f"no courier serves {order.address!r}")
        self.log.append(f"courier booked for {order.id}")
        return f"parcel-{order.id}"


SHOP = Shop()


@workflow(name="payment")
class Payment:
    async def run(self, ctx: WorkflowCtx, order: Order) -> str:
        return await ctx.step(SHOP.charge, order)


@workflow(name="shipping")
class Shipping:
    async def run(self, ctx: WorkflowCtx, order: Order) -> str:
        return await ctx.step(SHOP.book_courier, order)


@workflow(name="order")
class OrderSaga:
    async def run(self, ctx: WorkflowCtx, order: Order) -> str:
        await ctx.step(SHOP.reserve, order, compensate=SHOP.put_back)
        charge = await ctx.child("payment", order)  # child run "<order run id>.child.1"
        await ctx.step(note_charge, charge, compensate=SHOP.refund)  # its undo: the refund
        return await ctx.child("shipping", order)  # a failure here undoes both, in reverse


def note_charge(charge: str) -> str:
    """Record the payment child's charge in the order, so its undo gets it."""
    return charge


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{Path(tmp) / 'flowkit.db'}")
        engine = Engine(store, [OrderSaga(), Payment(), Shipping()], poll_interval=0.05)
        async with engine:
            good = Order(id="o-1", item="lamp", cents=4200, address="1 Main St")
            bad = Order(id="o-2", item="sofa", cents=90000, address="Atlantis, deep")
            await engine.start("order", good, "order-1")
            await engine.start("order", bad, "order-2")
            print("order-1:", await engine.result("order-1", timeout=30))
            try:
                await engine.result("order-2", timeout=30)
                raise AssertionError("order-2 should have failed")
            except WorkflowFailedError as err:
                assert err.error["type"] == ChildWorkflowError.__name__, err.error
                print("order-2 failed:", err.error["message"].splitlines()[0])
            history = await engine.history("order-2")
            children = [r.id for r in await engine.list_runs(parent_id="order-2")]
        store.close()
    print("order-2's children:", children)
    print("order-2's history:", " ".join(history.types))
    for line in SHOP.log:
        print("  ", line)
    undone = [line for line in SHOP.log if line.startswith(("refunded", "put back"))]
    assert undone == ["refunded charge-o-2", "put back stock-o-2"], undone
    assert "courier booked for o-1" in SHOP.log
    print("ok: the failed shipment undid the payment, then the reservation")


if __name__ == "__main__":
    asyncio.run(main())
