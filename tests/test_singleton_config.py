"""Singleton declaration and start-time checks: config validation, key() failures, the
``singleton:<key>`` tag and persisted key, unsupported stores, failing admission, namespaces
(docs/singleton.md, "Declaring a singleton", "Stores and singleton admission", "Namespaces")."""

from __future__ import annotations

import random
from typing import Any

import pytest
from singleton_kit import LaneIn, assert_gated, holders, inp, make_lane, types

import flowkit
from flowkit import ADMITTED_TAG, Engine, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.stores import MemoryStore
from flowkit_testing import TestEnv

# -- 1. Singleton(key, limit, max_queue_depth) validation ---------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": -1},
        {"limit": 1.5},
        {"limit": "2"},
        {"limit": None},
        {"limit": True},
        {"max_queue_depth": -1},
        {"max_queue_depth": 1.5},
        {"max_queue_depth": "3"},
        {"max_queue_depth": False},
        {"key": "store:A"},
        {"key": None},
    ],
    ids=lambda kw: "-".join(f"{k}={v!r}" for k, v in kw.items()),
)
def test_bad_singleton_config_raises_value_error_at_decoration(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"key": lambda i: i.key, **kwargs}
    with pytest.raises(ValueError):

        @workflow(name="bad", singleton=Singleton(**args))
        class Bad:
            async def run(self, ctx: WorkflowCtx, input: LaneIn) -> None:
                return None


def test_edge_singleton_configs_are_accepted() -> None:
    sg = Singleton(key=lambda i: i.key)
    assert (sg.limit, sg.max_queue_depth) == (1, None)
    zero = Singleton(key=lambda i: i.key, limit=3, max_queue_depth=0)
    assert (zero.limit, zero.max_queue_depth) == (3, 0)

    @workflow(name="ok", singleton=zero)
    class Ok:
        async def run(self, ctx: WorkflowCtx, input: LaneIn) -> None:
            return None

    assert Ok  # decorated without error


def _raising_key(i: Any) -> str:
    raise KeyError("no such store")


@pytest.mark.parametrize(
    "key",
    [_raising_key, lambda i: 42, lambda i: None, lambda i: b"bytes"],
    ids=["raises", "int", "none", "bytes"],
)
async def test_bad_key_result_fails_start_and_writes_nothing(key: Any) -> None:
    lane = make_lane(key=key)
    async with TestEnv([lane]) as env:
        with pytest.raises(flowkit.InvalidInputError) as info:
            await env.start("lane", inp("A"), "r1")
        assert info.value.workflow == "lane"
        assert await env.store.get_run("r1") is None
        assert await env.store.list_runs() == []
        assert lane.body["r1"] == 0


# -- 2. the singleton:<key> tag, the persisted key, admission by the stored key -----------


async def test_run_is_tagged_with_its_key_and_persists_it() -> None:
    lane = make_lane(key=lambda i: f"store:{i.key}")
    async with TestEnv([lane]) as env:
        started = await env.start("lane", inp("A"), "r1")
        assert "singleton:store:A" in started.tags
        assert started.singleton_key == "store:A"
        run = await env.get_run("r1")
        assert run.singleton_key == "store:A"
        assert run.tags[0] == "singleton:store:A"
        first = (await env.history("r1"))[0]
        assert first.type == "run_started"
        assert "singleton:store:A" in first.tags
        assert [r.id for r in await env.engines[0].list_runs(tag="singleton:store:A")] == ["r1"]


async def test_admission_uses_the_stored_key_after_the_key_function_changes() -> None:
    prefix = {"v": "old"}
    lane = make_lane(key=lambda i: f"{prefix['v']}:{i.key}")
    async with TestEnv([lane], gate_polls=True) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A"), "w1")
        await env.start("lane", inp("A", "signal"), "w2")
        await assert_gated(env, "w1")
        await assert_gated(env, "w2")

        prefix["v"] = "new"  # a redeploy changes the key function under queued runs
        await env.advance(5)  # the gate re-checks meanwhile: still the stored key
        await assert_gated(env, "w1")
        await assert_gated(env, "w2")
        assert (await env.get_run("w1")).singleton_key == "old:A"

        await env.signal("h", "go")
        assert (await env.get_run("h")).status is RunStatus.COMPLETED
        # w1 was admitted by its stored key, ran and released; w2 followed in order
        assert (await env.get_run("w1")).status is RunStatus.COMPLETED
        assert await holders(env) == ["w2"]
        assert lane.entered == ["h", "w1", "w2"]

        # a new start gets the new key: its own lane, admitted at once
        await env.start("lane", inp("A"), "n1")
        assert (await env.get_run("n1")).singleton_key == "new:A"
        assert (await env.get_run("n1")).status is RunStatus.COMPLETED
        await env.signal("w2", "go")
        assert (await env.get_run("w2")).status is RunStatus.COMPLETED


# -- 10. store support: absent/None try_admit_singleton, failing admission ---------------


class NoneAdmitStore(MemoryStore):
    try_admit_singleton = None  # type: ignore[assignment]


class AbsentAdmitStore:
    """Forwards everything to a MemoryStore except ``try_admit_singleton``."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name == "try_admit_singleton":
            raise AttributeError(name)
        return getattr(self._inner, name)


@pytest.mark.parametrize("store_cls", [NoneAdmitStore, AbsentAdmitStore])
async def test_store_without_admission_rejects_singleton_start(store_cls: type) -> None:
    lane = make_lane()
    store = store_cls()
    async with TestEnv([lane], store=store) as env:
        with pytest.raises(flowkit.UnsupportedStoreError):
            await env.start("lane", inp("A"), "r1")
        assert await store.list_runs() == []
        assert await store.get_run("r1") is None
        assert lane.body["r1"] == 0


class FlakyAdmitStore(MemoryStore):
    """A store whose admission transaction fails ``failures`` times, then works. It does not
    admit at creation, so every admission is the worker's gate check."""

    admits_on_create = False

    def __init__(self, failures: int = 1) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
    ) -> bool:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise RuntimeError("admission transaction failed: database is locked")
        return await super().try_admit_singleton(run_id, tag, workflow, limit, retry_wake_at)


async def test_failing_admission_never_runs_body_and_recovery_claims_again() -> None:
    lane = make_lane()
    store = FlakyAdmitStore(failures=1)
    async with TestEnv([lane], store=store, lease_ttl=30) as env:
        await env.start("lane", inp("A"), "r1")
        assert store.calls == 1
        run = await env.get_run("r1")
        assert run.status.active
        assert ADMITTED_TAG not in run.tags
        assert lane.body["r1"] == 0
        assert "singleton_admitted" not in await types(env, "r1")

        await env.advance(31)  # past the lease: recovery claims and admits again
        assert store.calls == 2
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert lane.body["r1"] == 1
        t = await types(env, "r1")
        assert t.count("singleton_admitted") == 1
        assert t[-2:] == ["singleton_released", "run_completed"]


class FlakyCreateAdmitStore(MemoryStore):
    """A store whose admission at creation fails ``failures`` times (the transaction is
    rolled back: nothing written), then works."""

    def __init__(self, failures: int = 1) -> None:
        super().__init__()
        self.failures = failures
        self.admit_calls = 0

    async def create_run(self, run: Any, events: Any, **kw: Any) -> tuple[Any, bool]:
        if kw.get("admission") is not None and self.failures:
            self.failures -= 1
            raise RuntimeError("admission transaction failed: database is locked")
        return await super().create_run(run, events, **kw)

    async def try_admit_singleton(self, *args: Any, **kw: Any) -> bool:
        self.admit_calls += 1
        return await super().try_admit_singleton(*args, **kw)


async def test_failing_admission_at_creation_writes_nothing_and_a_new_start_runs() -> None:
    lane = make_lane()
    store = FlakyCreateAdmitStore(failures=1)
    async with TestEnv([lane], store=store) as env:
        with pytest.raises(RuntimeError, match="admission transaction failed"):
            await env.start("lane", inp("A"), "r1")
        assert await store.list_runs() == []
        assert lane.body["r1"] == 0
        await env.run_until_idle()
        assert await store.get_run("r1") is None  # nothing left behind to recover

        await env.start("lane", inp("A"), "r1")  # the caller's retry
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert lane.body["r1"] == 1
        assert store.admit_calls == 0  # admitted by its create_run
        t = await types(env, "r1")
        assert t == ["run_started", "singleton_admitted", *t[2:]]
        assert t[-2:] == ["singleton_released", "run_completed"]


async def test_run_until_idle_recovers_after_failing_admission() -> None:
    """Regression: run_until_idle() used to skip the lease expiry of a live instance's dead
    activation, leaving the run ``running`` forever. The lease holder now retries the failed
    admission itself after a short backoff (docs/stores.md, "When the store fails")."""
    lane = make_lane()
    async with TestEnv([lane], store=FlakyAdmitStore(failures=1), lease_ttl=30) as env:
        t0 = env.clock.now()
        await env.start("lane", inp("A"), "r1")
        await env.run_until_idle()
        assert (await env.get_run("r1")).status is RunStatus.COMPLETED
        assert t0 < env.clock.now() < t0 + 1  # a retry's backoff (50 ms), not the 30 s lease
        assert lane.body["r1"] == 1


# -- 11. namespaces: unscoped stores share keys, scoped views do not ---------------------


def _worker(store: Any, wf: Any, env: TestEnv, **kw: Any) -> Engine:
    return Engine(store, [wf], clock=env.clock, poll_interval=None, rng=random.Random(7), **kw)


async def test_unscoped_store_shares_the_key_across_namespaces() -> None:
    lane = make_lane()
    base = MemoryStore()
    env = TestEnv(store=base)  # used for its clock and settle(); no instances started
    async with (
        _worker(base, lane, env, namespace="a", instance_id="ea") as ea,
        _worker(base, lane, env, namespace="b", instance_id="eb") as eb,
    ):
        await ea.start("lane", inp("A", "signal"), "ra")
        await env.settle()
        await eb.start("lane", inp("A", "signal"), "rb")
        await env.settle()
        ra, rb = await base.get_run("ra"), await base.get_run("rb")
        assert (ra.namespace, rb.namespace) == ("a", "b")
        assert ADMITTED_TAG in ra.tags
        assert rb.status is RunStatus.SUSPENDED and ADMITTED_TAG not in rb.tags
        assert lane.body["rb"] == 0
        assert (await eb.history("rb")).types[-1] == "singleton_gated"

        await ea.signal("ra", "go")
        await env.settle()
        assert ADMITTED_TAG in (await base.get_run("rb")).tags
        assert lane.entered == ["ra", "rb"]


async def test_scoped_views_do_not_share_the_key() -> None:
    lane = make_lane()
    base = MemoryStore()
    sa, sb = base.scoped("a"), base.scoped("b")
    env = TestEnv(store=base)
    async with (
        _worker(sa, lane, env, instance_id="ea") as ea,
        _worker(sb, lane, env, instance_id="eb") as eb,
    ):
        await ea.start("lane", inp("A", "signal"), "ra")
        await env.settle()
        await eb.start("lane", inp("A", "signal"), "rb")
        await env.settle()
        ra, rb = await sa.get_run("ra"), await sb.get_run("rb")
        assert (ra.namespace, rb.namespace) == ("a", "b")
        assert ADMITTED_TAG in ra.tags
        assert ADMITTED_TAG in rb.tags
        assert sorted(lane.entered) == ["ra", "rb"]
        assert await sa.get_run("rb") is None  # each view sees only its namespace
