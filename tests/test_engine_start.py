"""``Engine.start``'s checks before anything is written: idempotent restarts of an existing
run id never fail on them, and one length limit for run ids and singleton keys holds on every
store (MemoryStore, a SQLite file, PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from singleton_kit import LaneIn, inp, make_lane

import flowkit
from flowkit import Engine, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.stores import MemoryStore, SqlStore
from flowkit_testing import TestEnv

try:
    from pg import fresh_database
except ImportError:  # tests/ imported as a package
    from tests.pg import fresh_database

PG = pytest.param("postgres", marks=pytest.mark.postgres)


class Flags:
    key_raises = False


def _key(i: LaneIn) -> str:
    if Flags.key_raises:
        raise KeyError("the key function changed")
    return i.key


@pytest.fixture(autouse=True)
def _reset_flags() -> Iterator[None]:
    Flags.key_raises = False
    yield
    Flags.key_raises = False


# -- item 3: an existing run id returns the existing run ------------------------------------


async def test_restart_returns_the_run_when_the_key_function_now_raises() -> None:
    lane = make_lane(key=_key)
    async with TestEnv([lane]) as env:
        first = await env.start("lane", inp("A", "signal"), "r1")
        Flags.key_raises = True  # a deploy changed key(): it raises for the stored input
        again = await env.start("lane", inp("A", "signal"), "r1")
        assert (again.id, again.created_at, again.singleton_key) == ("r1", first.created_at, "A")
        assert again.status is RunStatus.SUSPENDED
        # a new id still gets the clear error, and nothing is written for it
        with pytest.raises(flowkit.InvalidInputError, match="singleton key"):
            await env.start("lane", inp("A", "signal"), "r2")
        assert await env.store.get_run("r2") is None
        assert [e.type for e in await env.history("r1")].count("run_started") == 1


async def test_restart_returns_the_run_on_a_store_without_admission() -> None:
    lane = make_lane()
    store = MemoryStore()
    async with TestEnv([lane], store=store) as env:
        await env.start("lane", inp("A", "signal"), "r1")
        # the same data seen through a store that lost singleton admission
        store.try_admit_singleton = None  # type: ignore[assignment,method-assign]
        again = await env.start("lane", inp("A", "signal"), "r1")
        assert again.id == "r1" and again.singleton_key == "A"
        with pytest.raises(flowkit.UnsupportedStoreError):
            await env.start("lane", inp("A", "signal"), "r2")
        assert await store.get_run("r2") is None


async def test_restart_returns_the_run_when_the_input_no_longer_validates() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "r1")
        again = await env.start("lane", {"key": 1}, "r1")  # invalid now: the run exists
        assert again.id == "r1" and again.input == inp("A", "signal")
        with pytest.raises(flowkit.InvalidInputError):
            await env.start("lane", {"key": 1}, "r2")
        assert await env.store.get_run("r2") is None


# -- item 5: one limit for ids and keys, checked before writing ------------------------------


def _store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqlStore(f"sqlite:///{tmp_path / 'flowkit.db'}")
    return SqlStore(fresh_database(request.getfixturevalue("pg_server")))


@workflow(name="keyed", singleton=Singleton(key=lambda s: s))
class Keyed:
    async def run(self, ctx: WorkflowCtx, input: str) -> int:
        return len(input)


@pytest.mark.parametrize("kind", ["memory", "sqlite", PG])
async def test_key_and_run_id_length_limit_is_the_same_on_every_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = _store(kind, request, tmp_path)
    try:
        async with Engine(store, [Keyed()]) as eng:
            longest = "é" * 255  # characters, not bytes: 510 bytes of UTF-8
            await eng.start("keyed", longest, "r" * 255)
            assert await eng.result("r" * 255, timeout=10) == 255
            with pytest.raises(flowkit.InvalidInputError, match="at most 255"):
                await eng.start("keyed", "k" * 256, "too-long-key")
            with pytest.raises(ValueError, match="at most 255"):
                await eng.start("keyed", "k", "r" * 256)
            assert [r.id for r in await eng.list_runs()] == ["r" * 255]
    finally:
        if isinstance(store, SqlStore):
            store.close()
