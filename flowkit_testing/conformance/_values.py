"""Checks of what comes back as it went in (timestamps, payloads) and of namespace scoping."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowkit.errors import (
    RunIdTakenError,
    RunNotFoundError,
)
from flowkit.events import (
    RunCompleted,
    TimerStarted,
)
from flowkit.stores.base import Update

from ._on_create import admission, claimed, create
from ._registry import check
from ._support import (
    T0,
    S,
    StoreFactory,
    expect,
    expect_eq,
    expect_raises,
    get,
    make_store,
    mk,
    put,
    started,
    tag_of,
)

# -- values ----------------------------------------------------------------------------------


@check()
async def check_microsecond_timestamps(factory: StoreFactory) -> None:
    """Every timestamp (run fields, lease, wake time, event ``at`` and payload times) comes
    back exactly, to the microsecond, as the same float."""
    s = await make_store(factory)
    stamps = [
        1767225600.123457,
        1767225600.000001,
        1767225600.999999,
        round(0.1 + 0.2, 6),
        0.1 + 0.2,
        4102444800.654321,
    ]
    for i, t in enumerate(stamps):
        await put(s, mk(f"r{i}", t=t))
        run = await get(s, f"r{i}")
        expect(
            repr(run.created_at) == repr(t) and repr(run.updated_at) == repr(t),
            f"created_at/updated_at {t!r} came back as {run.created_at!r}/{run.updated_at!r}",
        )
        (ev,) = await s.load_events(f"r{i}")
        expect_eq(ev.at, t, "run_started.at")
        claimed = await s.claim(f"r{i}", "w", t + 0.000001, t + 30.000001)
        expect(
            claimed is not None and claimed.lease_expires == t + 30.000001,
            f"lease_expires {t + 30.000001!r} came back as "
            f"{claimed.lease_expires if claimed else None!r}",
        )
        res = await s.commit(
            f"r{i}",
            "w",
            t + 0.000002,
            Update(
                events=[TimerStarted(pos="0", fire_at=t + 60.000003, at=t + 0.000002)],
                status=S.SUSPENDED,
                wake_at=t + 60.000003,
                release_lease=True,
            ),
        )
        got = await get(s, f"r{i}")
        expect_eq(got, res.run, "get_run after a commit with microsecond times")
        expect(
            got.wake_at == t + 60.000003 and got.updated_at == t + 0.000002,
            f"wake_at/updated_at {t + 60.000003!r}/{t + 0.000002!r} came back as "
            f"{got.wake_at!r}/{got.updated_at!r}",
        )
        last = (await s.load_events(f"r{i}"))[-1]
        expect_eq(
            (last.at, getattr(last, "fire_at", None)),
            (t + 0.000002, t + 60.000003),
            "timer_started (at, fire_at)",
        )
    expect_eq(
        [r.created_at for r in await s.list_runs()],
        sorted(stamps),
        "list_runs order by microsecond created_at",
    )


@check()
async def check_payloads_round_trip(factory: StoreFactory) -> None:
    """Inputs, outputs, errors, signal payloads and event payloads come back equal, floats
    staying floats."""
    s = await make_store(factory)
    payload = {
        "text": 'naïve ☃ "quoted" \\ \n',
        "ints": [0, -1, 2**53 + 1, 2**62],
        "floats": [0.5, 10.0, 1e-7, 1e20, 1767225600.123457],
        "nested": {"b": [True, False, None], "a": {"x": []}},
        "empty": {},
    }
    run = await put(s, dataclasses.replace(mk("r"), input=payload))
    expect_eq(await s.get_run("r"), run, "get_run of a run with a rich input")
    await s.deliver_signal("r", "sig", payload, T0)
    sig = await s.peek_signal("r", "sig")
    expect(sig is not None and sig.payload == payload, "signal payload round trip")
    await s.claim("r", "w", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w",
        T0 + 1,
        Update(
            events=[RunCompleted(output=payload, at=T0 + 1)],
            status=S.COMPLETED,
            output=payload,
            error={"type": "X", "message": "é"},
        ),
    )
    got = await get(s, "r")
    expect_eq(got, res.run, "get_run after a commit with rich payloads")
    expect_eq(got.output, payload, "output round trip")
    expect_eq(
        (await s.load_events("r"))[-1],
        RunCompleted(seq=2, output=payload, at=T0 + 1),
        "event payload round trip",
    )
    floats = got.output["floats"]
    expect(
        all(isinstance(f, float) for f in floats),
        f"floats must come back as floats: {floats!r}",
    )


# -- namespaces ------------------------------------------------------------------------------


@check(requires=["scoped"])
async def check_namespace_scoping(factory: StoreFactory) -> None:
    """``store.scoped(ns)`` sees, claims and signals only the runs of ``ns`` and stamps its
    namespace on the runs it creates; run ids stay unique across namespaces
    (``RunIdTakenError``); the unscoped store sees everything. With singleton support, a
    scoped store's keys are its own while the unscoped store shares keys across namespaces."""
    base: Any = await make_store(factory)
    a, b = base.scoped("A"), base.scoped("B")
    ra = await a.create_run(mk("ra"), started(mk("ra")))
    expect(ra[1] and ra[0].namespace == "A", f"a scoped create_run must stamp 'A': {ra[0]!r}")
    await put(b, dataclasses.replace(mk("rb", t=T0 + 1), namespace="B"))
    await put(base, mk("rn", t=T0 + 2))
    expect_eq([r.id for r in await a.list_runs()], ["ra"], "list_runs of namespace A")
    expect_eq([r.id for r in await base.list_runs()], ["ra", "rb", "rn"], "unscoped list_runs")
    expect_eq(await a.get_run("rb"), None, "get_run of another namespace's run")
    expect_eq(await a.get_run("rn"), None, "get_run of an unscoped run from namespace A")
    expect_eq(await a.claim("rb", "w", T0, T0 + 1), None, "claim of another namespace's run")
    expect_eq(await a.due_runs(T0 + 5, 10), ["ra"], "due_runs of namespace A")
    await expect_raises(
        RunNotFoundError, a.load_events("rb"), "load_events of another namespace's run"
    )
    await expect_raises(
        RunNotFoundError,
        a.deliver_signal("rb", "go", None, T0),
        "deliver_signal to another namespace's run",
    )
    await expect_raises(
        RunIdTakenError, b.create_run(mk("ra"), []), "create_run of an id taken in namespace A"
    )
    existing, created = await base.create_run(mk("ra"), [])
    expect(
        not created and existing.namespace == "A",
        "an unscoped create_run of an existing id must return it",
    )
    expect_eq((await a.create_run(mk("ra"), []))[0], existing, "a scoped idempotent create_run")
    if getattr(base, "try_admit_singleton", None) is None:
        return
    tag = tag_of("k")
    await put(a, dataclasses.replace(mk("sa", key="k", t=T0), namespace="A"))
    await put(b, dataclasses.replace(mk("sb", key="k", t=T0 + 1), namespace="B"))
    expect(await b.try_admit_singleton("sb", tag, "wf", 1, T0 + 1), "'sb' denied in B")
    expect(
        await a.try_admit_singleton("sa", tag, "wf", 1, T0 + 1),
        "'sa' denied in A although the key's holder 'sb' is in namespace B",
    )
    await put(base, mk("sn", key="k", t=T0 - 1))
    expect(
        not await base.try_admit_singleton("sn", tag, "wf", 2, T0 + 1),
        "the unscoped store admitted a third run to two slots held across namespaces",
    )
    if not getattr(base, "admits_on_create", False):
        return
    # admission at creation: the same rules, decided by create_run
    qa, _ = await create(a, claimed("qa", key="q"), admission(T0 + 1, key="q"))
    expect(qa.admitted and qa.namespace == "A", f"'qa' created in A: {qa!r}")
    qb, _ = await create(b, claimed("qb", key="q", t=T0 + 1), admission(T0 + 2, key="q"))
    expect(qb.admitted, f"'qb' was gated in B although the key's holder 'qa' is in A: {qb!r}")
    qn, _ = await create(
        base, claimed("qn", key="q", t=T0 + 2), admission(T0 + 3, limit=2, key="q")
    )
    expect(
        not qn.admitted and qn.status is S.SUSPENDED,
        f"the unscoped store admitted a third run at creation to two slots held across "
        f"namespaces: {qn!r}",
    )
