"""The app of the dashboard's browser tests (tests/test_ui_browser.py), served by
``flowkit worker ui_app:WORKFLOWS``: a singleton deploy per environment that holds its lane
until signalled ``go`` (so a lane has a holder and waiters), an approval that waits for a
signal and returns its payload, a charge that fails with its input in the error, an order that
waits for a child shipment, a quick greeting, and a stepper whose history grows on signals."""

from __future__ import annotations

from typing import Any

from flowkit import Singleton, WorkflowCtx, workflow


async def prepare(target: str) -> str:
    """A step, so that the deploy's timeline shows one."""
    return f"prepared {target}"


async def pack(order: str) -> str:
    """The shipment's one step."""
    return f"parcel-{order}"


@workflow(name="deploy", singleton=Singleton(key=lambda inp: f"env:{inp['env']}"))
class Deploy:
    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        prepared = await ctx.step(prepare, input["env"])
        await ctx.wait_for_signal("go")
        return f"{prepared}, deployed {input.get('version', '?')}"


@workflow(name="approval")
class Approval:
    async def run(self, ctx: WorkflowCtx, input: str) -> Any:
        return await ctx.wait_for_signal("approve")


@workflow(name="charge")
class Charge:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        raise ValueError(f"card declined for {input}")


@workflow(name="ship")
class Ship:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.step(pack, input)


@workflow(name="order")
class Order:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        parcel = await ctx.child(Ship, input)
        return f"order {input}: {parcel}"


@workflow(name="greet")
class Greet:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return f"hello {input}"


@workflow(name="stepper")
class Stepper:
    """Runs ``n`` steps for each ``more`` signal ``n``; completes on ``None``."""

    async def run(self, ctx: WorkflowCtx, input: str) -> int:
        done = 0
        while True:
            n = await ctx.wait_for_signal("more")
            if n is None:
                return done
            for _ in range(n):
                done += 1
                await ctx.step(prepare, f"{input} {done}")


WORKFLOWS = [Deploy, Approval, Charge, Ship, Order, Greet, Stepper]
