"""hello: the smallest complete flowkit program.

A workflow with two steps, a durable one-second sleep and a signal, run by a real ``Engine`` on
a ``MemoryStore`` with the system clock. Run it with ``python samples/hello.py``; it takes about
a second and prints the result and the run's history.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import MemoryStore


class Order(BaseModel):
    order_id: str
    amount_cents: int


class Receipt(BaseModel):
    order_id: str
    charged_cents: int
    approved_by: str


class Payments:
    """Stands in for a real payment service: the workflow only reaches it through steps."""

    async def reserve(self, order: Order) -> str:
        return f"hold-{order.order_id}"

    async def capture(self, hold_id: str, amount_cents: int) -> int:
        return amount_cents


@workflow(name="hello-order")
class HelloOrder:
    def __init__(self, payments: Payments) -> None:
        self.payments = payments

    async def run(self, ctx: WorkflowCtx, order: Order) -> Receipt:
        hold_id = await ctx.step(self.payments.reserve, order)
        await ctx.sleep(1)  # durable: the run suspends, a worker resumes it when due
        approver = await ctx.wait_for_signal("approve", timeout=60)
        charged = await ctx.step(self.payments.capture, hold_id, order.amount_cents)
        return Receipt(order_id=order.order_id, charged_cents=charged, approved_by=approver)


async def main() -> None:
    engine = Engine(MemoryStore(), [HelloOrder(Payments())])
    async with engine:
        await engine.start("hello-order", {"order_id": "o-42", "amount_cents": 1999}, "order-o-42")
        # Sent while the run sleeps: signals are buffered until wait_for_signal takes them.
        await engine.signal("order-o-42", "approve", "alice")
        receipt = await engine.result("order-o-42", timeout=10)
        history = await engine.history("order-o-42")

    print(f"result: {receipt!r}")
    print("history:")
    for event in history:
        print(f"  {event.seq:>2} {event.type}")


if __name__ == "__main__":
    asyncio.run(main())
