"""approval: a purchase request that publishes its progress, takes a validated update and
answers it, then times out waiting for a second one.

Run it with ``python samples/approval.py``. A real ``Engine`` on a ``MemoryStore`` with the
system clock: the run publishes its stage with ``ctx.set_event`` (a reader follows it with
``engine.get_event``), an update that raises the limit past the policy is rejected by the
workflow's ``@update_validator`` before anything is written, a valid one is taken with
``ctx.wait_for_update`` and answered with ``upd.reply``, and the wait for a second approval
ends with ``SignalTimeout`` after its (short) timeout.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from flowkit import (
    Engine,
    SignalTimeout,
    UpdateRejectedError,
    WorkflowCtx,
    update_validator,
    workflow,
)
from flowkit.stores import MemoryStore


class Request(BaseModel):
    item: str
    amount: int


class Approve(BaseModel):
    approver: str
    limit: int


@workflow(name="purchase", updates={"approve": Approve})
class Purchase:
    @update_validator("approve")
    def check_approve(self, arg: Approve) -> None:
        # runs in the caller's engine before anything is written to the run
        if arg.limit > 10_000:
            raise ValueError(f"{arg.approver} may approve up to 10000, not {arg.limit}")

    async def run(self, ctx: WorkflowCtx, req: Request) -> dict[str, object]:
        await ctx.set_event("stage", "awaiting approval")
        upd = await ctx.wait_for_update("approve", timeout=60)
        approved = req.amount <= upd.arg.limit
        await upd.reply({"approved": approved, "by": upd.arg.approver})
        await ctx.set_event("stage", "approved" if approved else "declined")
        try:  # a second signature, for large orders: not coming in this sample
            await ctx.wait_for_update("countersign", timeout=0.5)
            countersigned = True
        except SignalTimeout:
            countersigned = False
        ctx.set_event("stage", "done")  # (not awaited: written with the run's last write)
        return {"approved": approved, "countersigned": countersigned}


async def main() -> None:
    engine = Engine(MemoryStore(), [Purchase()])
    async with engine:
        await engine.start("purchase", {"item": "laptop", "amount": 2400}, "po-1")
        print("stage:", await engine.get_event("po-1", "stage", timeout=10))
        try:
            await engine.update("po-1", "approve", {"approver": "bob", "limit": 50_000})
        except UpdateRejectedError as exc:
            print("rejected:", exc.cause)
        reply = await engine.update(
            "po-1", "approve", {"approver": "carol", "limit": 5_000}, timeout=10
        )
        print("reply:", reply)
        result = await engine.result("po-1", timeout=10)
        print("stage:", await engine.get_event("po-1", "stage"))
        print("result:", result)
        history = await engine.history("po-1")
    types = [e.type for e in history]
    print("history:", " ".join(types))
    assert types.count("update_received") == 1  # the rejected update left no trace
    assert reply == {"approved": True, "by": "carol"}
    assert result == {"approved": True, "countersigned": False}
    print("ok: the rejected update wrote nothing, the valid one was answered")


if __name__ == "__main__":
    asyncio.run(main())
