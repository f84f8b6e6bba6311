"""Retry never undoes twice (docs/composing-workflows.md, "Retrying a compensated run"):
``engine.retry`` of a run whose compensations ran raises ``RunStateError`` naming them and
writes nothing, whether the run failed or died; ``flowkit retry`` prints that error and exits
non-zero; the dashboard offers no Retry for such a run and refuses the form if posted. The
effects are counted outside the store (a refund counter), on every store."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli_kit import flowkit
from ui_kit import TOKEN, client, parse

from flowkit import RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit.cli.ui._auth import Keys
from flowkit.errors import RunStateError
from flowkit.stores import SqlStore
from flowkit_testing import TestEnv

ONCE = RetryPolicy(max_attempts=1)


class Payments:
    """The world outside: charges and refunds, counted; ``ship_fails`` is how many times
    shipping fails (a transient failure: it works afterwards)."""

    def __init__(self, ship_fails: int = 1) -> None:
        self.ship_fails = ship_fails
        self.calls: Counter[str] = Counter()

    def charge(self, amount: int) -> str:
        self.calls["charge"] += 1
        return f"ch-{amount}"

    def refund(self, charge: str) -> str:
        self.calls["refund"] += 1
        return f"refunded {charge}"

    def ship(self, charge: str) -> str:
        self.calls["ship"] += 1
        if self.calls["ship"] <= self.ship_fails:
            raise ConnectionError("the carrier is down")
        return f"shipped against {charge}"


@workflow(name="order", max_recovery_attempts=1)
class Order:
    """Charge (undone by ``refund``), then ship (one attempt per activation)."""

    def __init__(self, pay: Payments) -> None:
        self.pay = pay

    async def run(self, ctx: WorkflowCtx, amount: int) -> str:
        charge = await ctx.step(self.pay.charge, amount, compensate=self.pay.refund, retry=ONCE)
        return await ctx.step(self.pay.ship, charge, retry=ONCE)


async def _compensated(env: TestEnv, pay: Payments, run_id: str = "o") -> tuple[Any, int]:
    """Run order ``run_id`` until it failed, its charge refunded; its status and history
    length."""
    await env.start("order", 120, run_id)
    await env.run_until_idle()
    run = await env.get_run(run_id)
    assert run.status is RunStatus.FAILED
    assert pay.calls == Counter(charge=1, ship=1, refund=1)
    return run, len(await env.history(run_id))


async def test_retry_of_a_compensated_run_is_refused_and_writes_nothing(store: Any) -> None:
    pay = Payments(ship_fails=1)  # (shipping would work now: a retry would complete it)
    async with TestEnv([Order(pay)], store=store) as env:
        before, n = await _compensated(env, pay)
        with pytest.raises(RunStateError, match=r"compensations ran \(Payments\.refund\)") as info:
            await env.retry("o")
        assert info.value.status == "failed" and info.value.run_id == "o"
        await env.run_until_idle()
        # nothing written, nothing run: no second refund, no order completed on a refund
        run = await env.get_run("o")
        assert (run.status, run.attempt, run.updated_at) == (
            before.status,
            before.attempt,
            before.updated_at,
        )
        assert len(await env.history("o")) == n
        assert pay.calls == Counter(charge=1, ship=1, refund=1)
        # (with a new input too: the refusal comes first)
        with pytest.raises(RunStateError, match="refund"):
            await env.retry("o", input=5)
        assert len(await env.history("o")) == n


async def test_a_failed_run_without_compensations_is_still_retried(store: Any) -> None:
    @workflow(name="order-plain")
    class Plain:
        def __init__(self, pay: Payments) -> None:
            self.pay = pay

        async def run(self, ctx: WorkflowCtx, amount: int) -> str:
            charge = await ctx.step(self.pay.charge, amount, retry=ONCE)
            return await ctx.step(self.pay.ship, charge, retry=ONCE)

    pay = Payments(ship_fails=1)
    async with TestEnv([Plain(pay)], store=store) as env:
        await env.start("order-plain", 7, "p")
        await env.run_until_idle()
        assert (await env.get_run("p")).status is RunStatus.FAILED
        await env.retry("p")
        await env.run_until_idle()
        assert await env.result("p") == "shipped against ch-7"
        assert pay.calls == Counter(charge=1, ship=2)


async def test_a_dead_run_whose_compensations_ran_is_refused_too(store: Any) -> None:
    """A run that died while compensating (its activation lost more than
    ``max_recovery_attempts`` times) had some effects undone: no retry either."""

    @workflow(name="trip", max_recovery_attempts=1)
    class Trip:
        def __init__(self, pay: Payments) -> None:
            self.pay = pay

        def give_back(self, charge: str) -> str:
            self.pay.calls["give_back"] += 1
            return f"given back {charge}"

        async def run(self, ctx: WorkflowCtx, amount: int) -> str:
            a = await ctx.step(self.pay.charge, amount, compensate=self.give_back, retry=ONCE)
            await ctx.step(self.pay.charge, amount + 1, compensate=self.pay.refund, retry=ONCE)
            return await ctx.step(self.pay.ship, a, retry=ONCE)

    pay = Payments(ship_fails=10)
    async with TestEnv([Trip(pay)], store=store) as env:
        # the second undo (of the first charge) kills the worker every time it is recorded
        env.crash_at(
            0,
            "before_compensation_record",
            match=lambda a, kw: any(
                str(getattr(e, "name", "")).endswith("give_back") for e in a[3].events
            ),
            times=None,
        )
        await env.start("trip", 1, "t")
        for _ in range(20):
            run = await env.get_run("t") if not env.crashed else None
            if run is not None and run.status.terminal:
                break
            if env.crashed:
                await env.restart(0)
            else:
                await env.run_until_idle()
        run = await env.get_run("t")
        assert run.status is RunStatus.DEAD
        assert pay.calls["refund"] == 1  # (recorded: never run again)
        n = len(await env.history("t"))
        with pytest.raises(RunStateError, match=r"compensations ran \(Payments\.refund\)"):
            await env.retry("t")
        assert len(await env.history("t")) == n
        assert (await env.get_run("t")).status is RunStatus.DEAD


APP = """
from collections import Counter
from flowkit import RetryPolicy, WorkflowCtx, workflow

ONCE = RetryPolicy(max_attempts=1)
CALLS = Counter()


def charge(amount: int) -> str:
    CALLS["charge"] += 1
    return f"ch-{amount}"


def refund(charge: str) -> str:
    CALLS["refund"] += 1
    return "refunded"


def ship(charge: str) -> str:
    raise ConnectionError("the carrier is down")


@workflow(name="order")
class Order:
    async def run(self, ctx: WorkflowCtx, amount: int) -> str:
        c = await ctx.step(charge, amount, compensate=refund, retry=ONCE)
        return await ctx.step(ship, c, retry=ONCE)


WORKFLOWS = [Order()]
"""


async def _failed_sqlite(tmp_path: Path) -> tuple[str, SqlStore]:
    """A SQLite file holding order ``o``, failed with its charge refunded."""
    (tmp_path / "order_app.py").write_text(APP)
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    store = SqlStore(url)
    pay = Payments(ship_fails=10)
    async with TestEnv([Order(pay)], store=store) as env:
        await _compensated(env, pay)
    return url, store


async def test_cli_retry_prints_the_refusal_and_exits_non_zero(tmp_path: Path) -> None:
    url, store = await _failed_sqlite(tmp_path)
    try:
        n = len(await store.load_events("o"))
        out = flowkit(tmp_path, "--db", url, "retry", "o")
        assert out.returncode != 0
        assert "compensations ran (Payments.refund)" in out.stderr and "'o'" in out.stderr
        with_app = flowkit(tmp_path, "--db", url, "retry", "o", "--app", "order_app:WORKFLOWS")
        assert with_app.returncode != 0 and "compensations ran" in with_app.stderr
        run = await store.get_run("o")
        assert run is not None and run.status is RunStatus.FAILED and run.attempt == 1
        assert len(await store.load_events("o")) == n
    finally:
        store.close()


async def test_the_dashboard_offers_no_retry_and_refuses_the_form(tmp_path: Path) -> None:
    _, store = await _failed_sqlite(tmp_path)
    try:
        n = len(await store.load_events("o"))
        async with client(store) as c:
            page = await c.get("/runs/o")
            doc = parse(page.text)
            assert doc.by_id("retry-button") is None and doc.by_id("retry-form") is None
            note = doc.by_id("retry-refused")
            assert note is not None and "compensations ran (Payments.refund)" in note.text
            # a form posted anyway (an old page, a script): the engine refuses it
            # (the page has no action form: the CSRF value the dashboard would give one)
            r = await c.post("/runs/o/retry", data={"csrf": Keys(TOKEN).csrf})
            assert r.status_code == 303
            flash = parse((await c.get(r.headers["location"])).text).by_id("flash")
            assert flash is not None and flash.get("data-kind") == "error"
            assert "compensations ran (Payments.refund)" in flash.text
        run = await store.get_run("o")
        assert run is not None and run.status is RunStatus.FAILED and run.attempt == 1
        assert len(await store.load_events("o")) == n
    finally:
        store.close()
