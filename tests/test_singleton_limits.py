"""A singleton limit below 1 (a key without a slot) is refused wherever a store is handed one:
``try_admit_singleton`` raises ``ValueError`` before it reads or writes anything (the store
conformance check ``admission_rejects_a_limit_below_one`` runs it on every bundled store),
``Admission`` and ``Notify`` cannot be built with one, and the ``flowkit.singleton`` helpers a
custom store decides with raise too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowkit import Run, RunStatus
from flowkit import singleton as sg
from flowkit.events import RunStarted
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore, SqlStore
from flowkit.stores.base import Admission, Notify

T0 = 1_767_225_600.0
TAG = "singleton:k"
BAD = [0, -1, True, 1.0, "1", None]


@pytest.fixture(params=["memory", "sqlite", "codec"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sql = SqlStore(f"sqlite:///{tmp_path / 'limits.db'}")
    if request.param == "codec":
        yield CodecStore(sql, AESGCMCodec([("k1", bytes(range(32)))]))
    else:
        yield sql
    sql.close()


def _waiter() -> Run:
    return Run(
        id="w", workflow="wf", workflow_version="1", status=RunStatus.PENDING, input=None,
        tags=(TAG,), created_at=T0, updated_at=T0, singleton_key="k",
    )  # fmt: skip


@pytest.mark.parametrize("limit", BAD)
async def test_try_admit_singleton_refuses_a_limit_below_one_and_writes_nothing(
    store: Any, limit: Any
) -> None:
    run = _waiter()
    await store.create_run(run, [RunStarted(at=T0, workflow="wf", version="1", input=None)])
    before = (await store.get_run("w"), await store.load_events("w"))
    with pytest.raises(ValueError, match="singleton limit must be an int >= 1"):
        await store.try_admit_singleton("w", TAG, "wf", limit, T0 + 1)
    assert (await store.get_run("w"), await store.load_events("w")) == before
    # (the argument is checked first: an unknown run with a bad limit is a ValueError too)
    with pytest.raises(ValueError):
        await store.try_admit_singleton("nope", TAG, "wf", limit, T0 + 1)
    assert await store.try_admit_singleton("w", TAG, "wf", 1, T0 + 1)


@pytest.mark.parametrize("limit", BAD)
def test_admission_and_notify_refuse_a_limit_below_one(limit: Any) -> None:
    with pytest.raises(ValueError, match="singleton limit"):
        Admission("wf", TAG, limit, T0 + 1)
    if limit is not None:  # (Notify's None: the limit is unknown to the releasing engine)
        with pytest.raises(ValueError, match="singleton limit"):
            Notify("wf", TAG, limit)
    assert Notify("wf", TAG, None).limit is None
    assert Admission("wf", TAG, 2, T0 + 1).limit == 2


@pytest.mark.parametrize("limit", [0, -1, True])
def test_the_helpers_refuse_a_limit_below_one(limit: Any) -> None:
    runs = [_waiter()]
    with pytest.raises(ValueError, match="singleton limit"):
        sg.admission_tags(runs, "w", TAG, "wf", limit)
    with pytest.raises(ValueError, match="singleton limit"):
        sg.waiters_to_wake(runs, TAG, "wf", limit)
    assert sg.waiters_to_wake(runs, TAG, "wf", None) == ["w"]
    assert sg.admission_tags(runs, "w", TAG, "wf", 1) == [TAG, "flowkit:singleton:admitted"]
