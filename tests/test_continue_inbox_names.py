"""Continue-as-new moves a signal by its exact name (docs/composing-workflows.md, "Signals and
updates follow the chain"): only flowkit's own staying prefixes (an event's mark, a child's
wake-up) stay with their run, compared as ``moves_to_successor`` compares them, case and all,
on every store (SQLite's ``LIKE`` ignores case: a user's ``Flowkit:Child:x`` stayed behind)."""

from __future__ import annotations

from typing import Any

from flowkit import WorkflowCtx, workflow
from flowkit.stores.base import moves_to_successor
from flowkit_testing import TestEnv

NAME = "Flowkit:Child:x"
"""A user's signal name (only ``flowkit:`` is reserved): it follows the chain."""


@workflow(name="cased")
class Cased:
    """Round 0 waits for ``go`` and continues as new; round 1 takes ``NAME``."""

    async def run(self, ctx: WorkflowCtx, n: int) -> Any:
        if n == 0:
            await ctx.wait_for_signal("go")
            ctx.continue_as_new(1)
        return await ctx.wait_for_signal(NAME)


async def test_a_signal_named_like_a_staying_prefix_in_another_case_moves(store: Any) -> None:
    assert moves_to_successor(NAME)
    async with TestEnv([Cased()], store=store) as env:
        await env.start("cased", 0, "c")
        await env.run_until_idle()
        await env.signal("c", NAME, 7)  # (not taken by round 0: moves with the continuation)
        await env.signal("c", "go")
        await env.run_until_idle()
        assert await env.result("c") == 7
        assert await env.store.peek_signal("c", NAME) is None
