"""Dead letters (``@workflow(max_recovery_attempts=N)``, docs/deadlines-and-dead-letters.md): lost
activations are counted durably in ``Run.recoveries`` by the claim that takes over a dead worker's
lease (and by ``release_leases`` of a restarted worker, never by a graceful stop); past ``N`` the
run settles ``dead`` before its body runs again, releasing its singleton slot to the next
waiter. ``engine.retry`` revives a dead run with the counter reset, optionally with a new
input validated as ``start`` validates it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_kit import flowkit as cli
from pydantic import BaseModel

import flowkit
from flowkit import RunStatus, Singleton, WorkflowCtx, workflow
from flowkit._model.definition import DEFAULT_MAX_RECOVERY_ATTEMPTS
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore, SqlStore
from flowkit_testing import TestEnv, VirtualClock


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """MemoryStore, then SqlStore on a real SQLite file."""
    if request.param == "memory":
        yield MemoryStore()
        return
    s = SqlStore(f"sqlite:///{tmp_path / 'dead.db'}")
    yield s
    s.close()


class Order(BaseModel):
    qty: int


@workflow(name="poison", max_recovery_attempts=2)
class Poison:
    """Its step's record kills the worker (``crash_at("before_step_record")``)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def work(self, qty: int) -> int:
        self.calls.append(qty)
        return qty * 2

    async def run(self, ctx: WorkflowCtx, input: Order) -> int:
        # (the step's name follows the input: a replay with another input diverges)
        return await ctx.step(self.work, input.qty, name=f"work-{input.qty}")


async def _crash_until_settled(env: TestEnv, run_id: str, rounds: int = 20) -> int:
    """Restart instance 0 each time it died, until the run settles; the restarts."""
    for n in range(rounds):
        run = await env.get_run(run_id) if not env.crashed else None
        if run is not None and run.status.terminal:
            return n
        if env.crashed:
            await env.restart(0)
        else:
            await env.run_until_idle()
    raise AssertionError(f"run {run_id} did not settle")


async def test_a_poison_run_goes_dead_after_its_recoveries(store: Any) -> None:
    wf = Poison()
    async with TestEnv(workflows=[wf], store=store) as env:
        env.crash_at(0, "before_step_record", times=None)
        await env.start("poison", {"qty": 2}, "p")
        assert env.crashed == [0]
        await _crash_until_settled(env, "p")
        run = await env.get_run("p")
        assert run.status is RunStatus.DEAD
        assert run.recoveries == 3  # two recoveries allowed, the third one kills it
        assert run.error is not None and run.error["type"] == "RunDead"
        assert "max_recovery_attempts=2" in run.error["message"]
        assert wf.calls == [2, 2, 2]  # the first activation and two recoveries: never a fourth
        hist = await env.history("p")
        assert hist.events[-1].type == "run_dead"
        assert hist.events[-1].recoveries == 3
        with pytest.raises(flowkit.WorkflowFailedError) as info:
            await env.result("p")
        assert info.value.error["type"] == "RunDead"
        assert [r.id for r in await env.engines[0].list_runs(status="dead")] == [run.id]


async def test_recoveries_count_lease_expiry_on_another_instance(store: Any) -> None:
    """A crashed instance's lease expires and another instance claims the run: the claim
    itself counts the lost activation."""
    wf = Poison()
    async with TestEnv(workflows=[wf], store=store, instances=2) as env:
        rule = env.crash_at(0, "before_step_record", times=None)
        rule.instance = None  # any instance that records the step dies
        await env.start("poison", {"qty": 1}, "p")
        await env.advance(31)  # instance 0's lease expired: instance 1 claims it, dies too
        run = await env.store.get_run("p")
        assert run.recoveries == 1 and run.status is RunStatus.RUNNING
        await env.restart(0)  # (instance 1 is down too: its lease expiry is the next claim)
        await env.advance(31)
        await env.restart(1)
        await env.run_until_idle()
        for i in env.crashed:
            await env.restart(i)
        await env.run_until_idle()
        run = await env.store.get_run("p")
        assert run.status is RunStatus.DEAD and run.recoveries == 3


async def test_a_graceful_stop_is_not_a_lost_activation(store: Any) -> None:
    @workflow(name="waits")
    class Waits:
        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            return str(await ctx.wait_for_signal("go"))

    async with TestEnv(workflows=[Waits()], store=store) as env:
        await env.start("waits", None, "w")
        for _ in range(3):  # a clean stop gives the lease back; nothing was lost
            await env.engines[0].stop()
            await env.engines[0].start_worker()
            await env.settle()
        await env.signal("w", "go", "x")
        assert await env.result("w") == "x"
        assert (await env.get_run("w")).recoveries == 0


async def test_retry_revives_a_dead_run_with_the_counter_reset(store: Any) -> None:
    wf = Poison()
    async with TestEnv(workflows=[wf], store=store) as env:
        rule = env.crash_at(0, "before_step_record", times=None)
        await env.start("poison", {"qty": 3}, "p")
        await _crash_until_settled(env, "p")
        assert (await env.get_run("p")).status is RunStatus.DEAD
        rule.times = rule.fired  # the cause is fixed: no more crashes
        run = await env.retry("p")
        assert run.recoveries == 0
        assert await env.result("p") == 6
        types = [e.type for e in (await env.history("p")).events]
        assert types[-3:] == ["run_retried", "step_completed", "run_completed"]


async def test_retry_with_a_new_input(store: Any) -> None:
    wf = Poison()
    async with TestEnv(workflows=[wf], store=store) as env:
        rule = env.crash_at(0, "before_step_record", times=None)
        await env.start("poison", {"qty": 3}, "p")
        await _crash_until_settled(env, "p")
        rule.times = rule.fired
        before = await env.history("p")
        # invalid: refused as start refuses it, and nothing is written
        with pytest.raises(flowkit.InvalidInputError):
            await env.retry("p", input={"qty": "many"})
        assert (await env.get_run("p")).status is RunStatus.DEAD
        assert len((await env.history("p")).events) == len(before.events)
        run = await env.retry("p", input={"qty": "5"})  # coerced like a start's input
        assert run.input == {"qty": 5}
        assert await env.result("p") == 10
        retried = next(e for e in (await env.history("p")).events if e.type == "run_retried")
        assert retried.new_input and retried.input == {"qty": 5}
        # replay takes the latest input (a replay with the first one would call work-3)
        hist = await env.history("p")
        await flowkit.replay_async(hist, Poison)
        first_only = flowkit.History(
            hist.run_id,
            [
                e.model_copy(update={"new_input": False, "input": None})
                if e.type == "run_retried"
                else e
                for e in hist.events
            ],
        )
        with pytest.raises(flowkit.NonDeterminismError):
            await flowkit.replay_async(first_only, Poison)


async def test_retry_refuses_a_run_that_is_neither_failed_nor_dead(store: Any) -> None:
    async with TestEnv(workflows=[Poison()], store=store) as env:
        await env.start("poison", {"qty": 1}, "p")
        assert await env.result("p") == 2
        with pytest.raises(flowkit.RunStateError, match="failed or dead"):
            await env.retry("p")
        with pytest.raises(flowkit.RunStateError):
            await env.retry("p", input={"qty": 2})


@workflow(name="poison-lane", singleton=Singleton(key=lambda o: "lane"), max_recovery_attempts=1)
class PoisonLane:
    def __init__(self) -> None:
        self.done: list[int] = []

    def work(self, qty: int) -> int:
        self.done.append(qty)
        return qty

    async def run(self, ctx: WorkflowCtx, input: Order) -> int:
        return await ctx.step(self.work, input.qty)


async def test_a_dead_singleton_holder_releases_its_slot_to_the_next_waiter(store: Any) -> None:
    wf = PoisonLane()
    async with TestEnv(workflows=[wf], store=store) as env:
        env.crash_at(0, "before_step_record", match=lambda a, kw: a[0] == "holder", times=None)
        await env.start("poison-lane", {"qty": 1}, "holder")
        await env.restart(0)
        await env.start("poison-lane", {"qty": 2}, "waiter")
        assert (await env.get_run("waiter")).status is RunStatus.SUSPENDED  # gated
        await _crash_until_settled(env, "holder")
        await env.run_until_idle()
        holder = await env.get_run("holder")
        assert holder.status is RunStatus.DEAD and not holder.admitted
        types = [e.type for e in (await env.history("holder")).events]
        assert types[-2:] == ["singleton_released", "run_dead"]
        assert await env.result("waiter") == 2
        waiter = [e.type for e in (await env.history("waiter")).events]
        assert "singleton_admitted" in waiter


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_bad_max_recovery_attempts_is_refused_at_decoration(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_recovery_attempts"):

        @workflow(name="bad", max_recovery_attempts=bad)
        class Bad:
            async def run(self, ctx: WorkflowCtx, input: None) -> None:
                return None


def test_the_default_bound_is_finite() -> None:
    @workflow(name="plain")
    class Plain:
        async def run(self, ctx: WorkflowCtx, input: None) -> None:
            return None

    defn = flowkit._model.definition.definition_of(Plain)
    assert defn is not None
    assert defn.max_recovery_attempts == DEFAULT_MAX_RECOVERY_ATTEMPTS == 10
    assert defn.execution_timeout is None


# -- a retry's new input is a payload: CodecStore encrypts it -------------------------------

NEW_SECRET = "RETRY-INPUT-SECRET-7f3a"


@workflow(name="vault-retry")
class VaultRetry:
    def __init__(self) -> None:
        self.fail = True

    def open(self, secret: str) -> int:
        if self.fail:
            raise RuntimeError("locked")
        return len(secret)

    async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> int:
        return await ctx.step(self.open, input["secret"])


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "codec"])
async def test_a_retry_input_is_ciphertext_at_rest(encrypted: bool, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'vault.db'}"
    inner = SqlStore(url)
    store: Any = CodecStore(inner, AESGCMCodec([("k1", bytes(range(32)))])) if encrypted else inner
    wf = VaultRetry()
    try:
        async with TestEnv(workflows=[wf], store=store) as env:
            await env.start("vault-retry", {"secret": "old"}, "v")
            await env.run_until_idle()
            assert (await env.get_run("v")).status is RunStatus.FAILED
            wf.fail = False
            await env.retry("v", input={"secret": NEW_SECRET})
            assert await env.result("v") == len(NEW_SECRET)
            retried = next(e for e in (await env.history("v")).events if e.type == "run_retried")
            assert retried.input == {"secret": NEW_SECRET}  # decoded through the store
            assert (await env.get_run("v")).input == {"secret": NEW_SECRET}
    finally:
        inner.close()
    path = Path(url.removeprefix("sqlite:///"))
    raw = b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
    # the plain database holds it (so this test can fail), the encrypted one does not
    assert (NEW_SECRET.encode() in raw) is not encrypted
    assert b"run_retried" in raw


class _RawListing(CodecStore):
    """A keyless worker's store, for ``TestEnv``: its time skipping reads every run's due
    time with ``list_runs``, which the raw rows answer (nothing of them needs decoding)."""

    async def list_runs(self, **kw: Any) -> Any:
        return await self.inner.list_runs(**kw)


@workflow(name="keyed", max_recovery_attempts=1)
class Keyed:
    async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> str:
        return input["secret"].upper()


async def test_a_worker_without_the_key_steps_away_without_counting_a_loss(
    tmp_path: Path,
) -> None:
    """A worker that cannot decode a run (it lacks the key of a rotation in progress) gives
    its lease back, parked for a lease period: no activation was lost, so the run does not
    go ``dead``, and a worker with the key runs it."""
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    k1, k2 = bytes(range(32)), bytes(range(1, 33))
    inner_full, inner_old = SqlStore(url), SqlStore(url)
    full = CodecStore(inner_full, AESGCMCodec([("k1", k1), ("k2", k2)]))  # writes with k2
    old = _RawListing(inner_old, AESGCMCodec([("k1", k1)]))
    try:
        client = flowkit.Engine(full, [Keyed()], worker=False, clock=VirtualClock())
        await client.start("keyed", {"secret": "s"}, "r")
        async with TestEnv(workflows=[Keyed()], store=old) as keyless:
            for _ in range(5):  # five lease periods of trying: never a loss
                await keyless.advance(30)
        run = await inner_full.get_run("r")
        assert run is not None and run.status is RunStatus.SUSPENDED
        assert run.recoveries == 0 and run.lease_owner is None
        async with TestEnv(workflows=[Keyed()], store=full, start=run.updated_at) as keyed:
            await keyed.advance(30)
            assert await keyed.result("r") == "S"
    finally:
        inner_full.close()
        inner_old.close()


# -- the CLI: `dead` everywhere, run_dead and the cancel reason in a timeline --------------


@workflow(name="timed-cli", execution_timeout=60)
class TimedCli:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        await ctx.wait_for_signal("go")
        return "done"


async def test_cli_lists_dead_runs_and_prints_their_timeline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = SqlStore(url)
    try:
        async with TestEnv(workflows=[Poison(), TimedCli()], store=store) as env:
            env.crash_at(0, "before_step_record", times=None)
            await env.start("poison", {"qty": 2}, "p")
            await _crash_until_settled(env, "p")
            env.rules.clear()
            await env.start("timed-cli", None, "t")
            await env.run_until_idle()
            assert (await env.get_run("t")).status is RunStatus.CANCELLED
    finally:
        store.close()
    runs = cli(tmp_path, "--db", url, "runs", "--status", "dead")
    assert runs.returncode == 0, runs.stderr
    lines = runs.stdout.splitlines()
    assert any(line.startswith("p ") and "dead" in line for line in lines), runs.stdout
    assert not any(line.startswith("t ") for line in lines)
    shown = cli(tmp_path, "--db", url, "show", "p")
    assert "[dead]" in shown.stdout and "recovered 3 times" in shown.stdout
    assert "RunDead:" in shown.stdout
    dead = cli(tmp_path, "--db", url, "history", "p")
    assert dead.returncode == 0, dead.stderr
    assert "run_dead" in dead.stdout and "activation lost 3 times" in dead.stdout
    timed = cli(tmp_path, "--db", url, "history", "t")
    line = next(ln for ln in timed.stdout.splitlines() if "cancel_requested" in ln)
    assert "reason execution timeout" in line


async def test_a_worker_restarted_under_its_id_counts_the_leases_it_takes_back(
    store: Any,
) -> None:
    """The same instance id back after a crash takes its dead predecessor's leases back at
    once (``release_leases``): each is a lost activation."""
    gate = asyncio.Event()

    @workflow(name="hangs", max_recovery_attempts=1)
    class Hangs:
        async def wait(self) -> str:
            await gate.wait()
            return "free"

        async def run(self, ctx: WorkflowCtx, input: None) -> str:
            return await ctx.step(self.wait)

    async with TestEnv(workflows=[Hangs()], store=store) as env:
        eng = env.engines[0]
        await env.start("hangs", None, "h")
        for lost in (1, 2):
            assert eng.executing("h")
            await eng.crash()  # (the engine object stays: its next worker has the same id)
            await eng.start_worker()
            await env.settle()
            run = await env.get_run("h")
            assert run.recoveries == lost
        assert run.status is RunStatus.DEAD
        assert not eng.executing("h")
