"""The quotes of docs/debugging.md ("Golden histories in CI") and docs/cli.md."""

from __future__ import annotations

from flowkit import WorkflowCtx, workflow


class Catalog:
    async def price(self, sku: str) -> int:
        return {"pen": 3, "desk": 1200}.get(sku, 10)


@workflow(name="quote")
class Quote:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    async def run(self, ctx: WorkflowCtx, sku: str) -> int:
        price = await ctx.step(self.catalog.price, sku)
        if price > 1000:
            await ctx.sleep(3600)  # big quotes wait an hour before they are sent
        return price


@workflow(name="greeting")
class Greeting:
    async def run(self, ctx: WorkflowCtx, name: str) -> str:
        return f"hello {name}"


quote = Quote(Catalog())  # for `flowkit replay --workflow myapp.quotes:quote`
