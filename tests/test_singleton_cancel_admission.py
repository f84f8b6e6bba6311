"""A run cancelled while its own admission check is in flight settles ``cancelled`` without a
``singleton_gated`` record (a cancelled run is not gated), whether the key was free or not."""

from __future__ import annotations

from typing import Any

import pytest
from singleton_kit import get, inp, make_lane, types

from flowkit import Engine, RunStatus
from flowkit.stores import MemoryStore
from flowkit_testing import TestEnv


class CancelDuringAdmission(MemoryStore):
    """A MemoryStore that, once, lets a client cancel ``target`` just before the admission
    check of ``target`` runs: the interleaving of a cancel racing the worker's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.client: Engine | None = None
        self.target = ""

    async def try_admit_singleton(self, run_id: str, *args: Any, **kwargs: Any) -> bool:
        client, self.client = self.client, None
        if client is not None and run_id == self.target:
            await client.cancel(run_id)
        return await super().try_admit_singleton(run_id, *args, **kwargs)


@pytest.mark.parametrize("key_free", [True, False])
async def test_cancel_during_the_admission_check_settles_cancelled_not_gated(
    key_free: bool,
) -> None:
    lane = make_lane()
    store = CancelDuringAdmission()
    async with TestEnv([lane], store=store) as env:
        if not key_free:
            await env.start("lane", inp("A", "signal"), "holder")
        client = Engine(store, [lane], worker=False, clock=env.clock)
        await client.start("lane", inp("A"), "w")  # pending: a worker's gate check admits it
        store.client, store.target = client, "w"
        await env.advance(1)
        await env.settle()
        assert store.client is None  # the interleaving happened
        run = await get(env, "w")
        assert run.status is RunStatus.CANCELLED
        assert await types(env, "w") == ["run_started", "cancel_requested", "run_cancelled"]
        assert lane.body["w"] == 0
        if not key_free:
            assert (await get(env, "holder")).admitted
