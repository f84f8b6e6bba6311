"""Unit tests of the public helpers for custom stores: ``flowkit.singleton.admission_tags``
and ``flowkit.singleton.denial_patch`` over hand-built runs (docs/singleton.md,
"Implementing admission in your own store")."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from flowkit import ADMITTED_TAG, Run, RunStatus
from flowkit.singleton import admission_tags, denial_patch
from flowkit.stores import MemoryStore
from flowkit.stores.base import Admission

TAG = "singleton:store:A"
WF = "sync"


def run(
    rid: str,
    status: str = "suspended",
    *,
    admitted: bool = False,
    created_at: float = 100.0,
    tag: str = TAG,
    workflow: str = WF,
    extra: tuple[str, ...] = (),
) -> Run:
    tags = (tag, *extra, *((ADMITTED_TAG,) if admitted else ()))
    return Run(
        id=rid,
        workflow=workflow,
        workflow_version="1",
        status=RunStatus(status),
        input=None,
        tags=tags,
        created_at=created_at,
    )


def admit(runs: list[Run], rid: str, limit: int = 1) -> list[str] | None:
    return admission_tags(runs, rid, TAG, WF, limit)


# -- admission_tags ------------------------------------------------------------------------


def test_first_waiter_with_a_free_slot_gets_the_marker_appended() -> None:
    runs = [run("a", "running", extra=("team:ops",))]
    assert admit(runs, "a") == [TAG, "team:ops", ADMITTED_TAG]


@pytest.mark.parametrize("status", ["running", "suspended", "blocked", "cancelling", "pending"])
def test_holder_keeps_its_slot_in_every_active_status(status: str) -> None:
    holder = run("z-holder", status, admitted=True, created_at=200.0)
    older = run("a-older", "running", created_at=1.0)
    runs = [older, holder]
    # an older, smaller-id waiter cannot displace it
    assert admit(runs, "a-older") is None
    # the holder is re-admitted as it is (idempotent: tags unchanged)
    assert admit(runs, "z-holder") == list(holder.tags)


def test_free_slots_go_to_waiters_by_created_at_then_id() -> None:
    runs = [
        run("h", "running", admitted=True, created_at=50.0),
        run("b", created_at=100.0),
        run("Z", created_at=100.0),  # "Z" < "b" by code point
        run("a", created_at=99.0),
        run("c", created_at=100.0),
    ]
    # limit 3: one holder, two free slots -> "a" (older), then "Z"
    assert admit(runs, "a", 3) is not None
    assert admit(runs, "Z", 3) is not None
    assert admit(runs, "b", 3) is None
    assert admit(runs, "c", 3) is None
    # limit 1: no free slot for anyone but the holder
    assert [rid for rid in "aZbc" if admit(runs, rid, 1)] == []


def test_code_point_order_not_locale_order() -> None:
    runs = [run("é"), run("z"), run("B")]
    assert admit(runs, "B") is not None
    assert admit(runs, "z") is None
    runs = [run("é"), run("z")]
    assert admit(runs, "z") is not None
    assert admit(runs, "é") is None


def test_pending_runs_take_part_in_order_but_hold_nothing() -> None:
    pending_older = run("p", "pending", created_at=1.0)
    me = run("m", "running", created_at=2.0)
    assert admit([pending_older, me], "m") is None  # the older pending run is first in line
    assert admit([pending_older, me], "m", 2) is not None  # but it holds no slot
    assert admit([pending_older, me], "p") is not None


def test_cancelling_waiter_is_never_admitted_and_does_not_block_others() -> None:
    cancelling = run("a", "cancelling", created_at=1.0)
    later = run("b", "suspended", created_at=2.0)
    assert admit([cancelling, later], "a") is None
    assert admit([cancelling, later], "a", 5) is None
    assert admit([cancelling, later], "b") is not None


def test_cancelling_holder_keeps_its_slot() -> None:
    holder = run("h", "cancelling", admitted=True, created_at=5.0)
    waiter = run("w", created_at=1.0)
    assert admit([holder, waiter], "h") == list(holder.tags)
    assert admit([holder, waiter], "w") is None


@pytest.mark.parametrize("status", ["completed", "failed", "cancelled"])
def test_terminal_runs_are_never_admitted_and_never_hold(status: str) -> None:
    stale = run("t", status, admitted=True, created_at=1.0)  # a stale marker on a settled run
    waiter = run("w", created_at=2.0)
    assert admit([stale, waiter], "t") is None
    assert admit([stale, waiter], "t", 5) is None
    assert admit([stale, waiter], "w") is not None


def test_other_workflows_other_keys_and_unknown_runs_are_ignored() -> None:
    other_wf = run("x", "running", admitted=True, workflow="other", created_at=1.0)
    other_key = run("y", "running", admitted=True, tag="singleton:store:B", created_at=1.0)
    me = run("m", created_at=2.0)
    assert admit([other_wf, other_key, me], "m") is not None
    assert admit([other_wf, other_key, me], "x") is None  # not a run of this workflow
    assert admit([other_wf, other_key, me], "y") is None  # not a run of this key
    assert admit([me], "missing") is None


# -- denial_patch --------------------------------------------------------------------------


def deny(runs: list[Run], rid: str, wake: float | None = 101.0) -> dict[str, object] | None:
    return denial_patch(runs, rid, TAG, WF, wake)


@pytest.mark.parametrize("status", ["pending", "running", "suspended", "blocked"])
def test_denied_active_waiter_is_parked_suspended_with_the_retry_time(status: str) -> None:
    runs = [run("h", "running", admitted=True), run("w", status)]
    assert deny(runs, "w", 101.25) == {"status": RunStatus.SUSPENDED, "wake_at": 101.25}


@pytest.mark.parametrize("status", ["cancelling", "completed", "failed", "cancelled"])
def test_terminal_or_cancelling_runs_are_never_patched(status: str) -> None:
    runs = [run("h", "running", admitted=True), run("w", status)]
    assert deny(runs, "w") is None


def test_no_patch_without_a_retry_time_for_holders_or_foreign_runs() -> None:
    runs = [
        run("h", "running", admitted=True),
        run("w"),
        run("x", workflow="other"),
        run("y", tag="singleton:other"),
    ]
    assert deny(runs, "w", None) is None
    assert deny(runs, "h") is None  # a holder is never parked by a denial
    assert deny(runs, "x") is None
    assert deny(runs, "y") is None
    assert deny(runs, "missing") is None


# -- MemoryStore decides over the same runs as the helpers over the whole key ---------------

STATUSES = ["pending", "running", "suspended", "blocked", "cancelling", "completed", "failed"]


def random_key(rng: random.Random, n: int, namespaces: bool) -> list[Run]:
    """Runs of one key in random states: ties in ``created_at``, holders and waiters in every
    status, runs of other namespaces."""
    out = []
    for i in range(n):
        status = rng.choice(STATUSES)
        admitted = status not in ("completed", "failed") and rng.random() < 0.2
        r = run(f"r{rng.randrange(10**6):06d}-{i}", status, admitted=admitted,
                created_at=100.0 + rng.randrange(n // 2 + 1))  # fmt: skip
        if namespaces:
            r = replace(r, namespace=rng.choice(["a", "b"]))
        out.append(r)
    return out


@pytest.mark.parametrize("seed", range(60))
async def test_memory_store_admits_as_the_helpers_over_the_whole_key(seed: int) -> None:
    """``MemoryStore`` reads only a key's holders and its oldest waiters (as the SQL stores
    do): its admissions, denials and admissions at creation must be the helpers' decisions
    over every run of the key, queues longer than the limit included."""
    rng = random.Random(seed)
    namespaces = seed % 3 == 0
    runs = random_key(rng, rng.randrange(1, 40), namespaces)
    limit = rng.choice([1, 2, 3])
    data = MemoryStore()
    for r in runs:
        data._put(r)
    store = data.scoped("a") if namespaces else data
    visible = [r for r in runs if not namespaces or r.namespace == "a"]
    for r in rng.sample(visible, min(len(visible), 8)):
        sharing = [store._d.runs[x.id] for x in visible]
        sharing = [x for x in sharing if x.status.active]
        me = store._d.runs[r.id]
        want_tags = admission_tags(sharing, r.id, TAG, WF, limit)
        recheck = rng.random() < 0.5  # (a re-check parks behind the heads untimed)
        heads = limit if recheck else None
        want_patch = None if want_tags else denial_patch(sharing, r.id, TAG, WF, 999.0, heads)
        got = await store.try_admit_singleton(r.id, TAG, WF, limit, 999.0, recheck=recheck)
        after = store._d.runs[r.id]
        assert got == (want_tags is not None)
        if want_tags is not None:
            assert list(after.tags) == want_tags
        elif want_patch:
            assert (after.status, after.wake_at) == (want_patch["status"], want_patch["wake_at"])
        else:
            assert after == me
    # a new run at creation, late or tied with the oldest
    new = run("new", "running", created_at=rng.choice([100.0, 1000.0]))
    if namespaces:
        new = replace(new, namespace="a")
    sharing = [x for x in (store._d.runs[v.id] for v in visible) if x.status.active]
    want = admission_tags([*sharing, new], "new", TAG, WF, limit)
    adm = Admission(WF, TAG, limit, 999.0, ())
    stored, created = await store.create_run(new, [], admission=adm)
    assert created and (ADMITTED_TAG in stored.tags) == (want is not None)
