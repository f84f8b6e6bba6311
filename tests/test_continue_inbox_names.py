"""Continue-as-new moves a signal by its exact name (docs/composing-workflows.md, "Signals and
updates follow the chain"): only flowkit's own staying prefixes (an event's mark, a child's
wake-up) stay with their run, compared as ``moves_to_successor`` compares them, case and all,
on every store (SQLite's ``LIKE`` ignores case: a user's ``Flowkit:Child:x`` stayed behind)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_kit import flowkit

from flowkit import Run, RunStatus, WorkflowCtx, workflow
from flowkit.errors import CodecError
from flowkit.stores import CodecStore, MemoryStore, SqlStore
from flowkit.stores.base import moves_to_successor
from flowkit_testing import TestEnv

try:
    from store_kit import codec as make_codec
except ImportError:  # tests/ imported as a package
    from tests.store_kit import codec as make_codec

T0 = 1_700_000_000.0
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


@workflow(name="hop")
class Hop:
    """Round 0 continues as new at once; round 1 takes ``a``."""

    async def run(self, ctx: WorkflowCtx, n: int) -> Any:
        if n == 0:
            ctx.continue_as_new(1)
        return await ctx.wait_for_signal("a")


async def test_flowkit_signal_names_the_run_of_the_chain_that_got_it(tmp_path: Path) -> None:
    """``flowkit signal`` to the first id of a chain: the line names the chain's last run
    (the one that got it, and its status), not the first, settled ``completed``."""
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    store = SqlStore(url)
    try:
        async with TestEnv([Hop()], store=store) as env:
            await env.start("hop", 0, "h")
            await env.run_until_idle()
            out = flowkit(tmp_path, "--db", url, "signal", "h", "a", "5")
            assert out.returncode == 0, out.stderr
            assert out.stdout == "delivered signal 'a' to h~1 (it was waiting for it)\n"
            await env.run_until_idle()
            assert await env.result("h") == 5
    finally:
        store.close()


async def test_a_codec_payload_bound_to_an_earlier_run_of_the_chain_still_decodes() -> None:
    """A signal an older flowkit delivered to ``r~1`` was bound to ``r~1``; pending when the
    run continues after the upgrade, it moves on (to ``r~2``, ``r~3``): it still decodes in
    any later run of the chain, and still fails in another chain."""
    inner = MemoryStore()
    c = make_codec()
    s = CodecStore(inner, c)
    for rid in ("r~3", "other~3"):
        run = Run(rid, "wf", "1", RunStatus.PENDING, None, created_at=T0, updated_at=T0)
        await inner.create_run(run, [])
    old = c.encode({"n": 1}, context=("r~1", "signal", "a"))  # (the binding before, to r~1)
    await inner.deliver_signal("r~3", "a", old, T0)  # (moved on twice since)
    assert (await s.peek_signal("r~3", "a")).payload == {"n": 1}
    await inner.deliver_signal("other~3", "a", old, T0)
    with pytest.raises(CodecError):
        await s.peek_signal("other~3", "a")
