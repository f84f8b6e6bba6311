"""Shared pieces of the conformance checks: the error, store factories, run builders and
assertion helpers. Nothing here imports pytest."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeAlias

from flowkit import Run, RunStatus
from flowkit.events import Event, RunStarted, TimerFired
from flowkit.stores.base import Store

T0 = 1_767_225_600.0
"""The instant every check builds its runs around: 2026-01-01T00:00:00Z."""
WF = "wf"
S = RunStatus

StoreFactory: TypeAlias = Callable[[], "Store | Awaitable[Store]"]
"""Returns a fresh, empty, unscoped store (sync or async)."""
PairFactory: TypeAlias = Callable[[], "tuple[Store, Store] | Awaitable[tuple[Store, Store]]"]
"""Returns two store objects over the same fresh, empty data (two processes' views)."""


class ConformanceError(AssertionError):
    """A store broke the contract of ``flowkit.stores.base.Store``; the message names the check
    and says what was expected and what the store did."""


async def make_store(factory: StoreFactory) -> Store:
    made = factory()
    return await made if inspect.isawaitable(made) else made


async def make_pair(factory: PairFactory) -> tuple[Store, Store]:
    made = factory()
    pair = await made if inspect.isawaitable(made) else made
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise TypeError(f"make_pair must return a tuple of two stores, got {pair!r}")
    return pair


def same_store_pair(factory: StoreFactory) -> PairFactory:
    """A pair factory for a store without one: the same object twice."""

    async def pair() -> tuple[Store, Store]:
        s = await make_store(factory)
        return s, s

    return pair


# -- builders --------------------------------------------------------------------------------


def tag_of(key: str) -> str:
    return f"singleton:{key}"


def mk(
    run_id: str,
    *,
    t: float = T0,
    wf: str = WF,
    key: str | None = None,
    status: RunStatus = S.PENDING,
    tags: tuple[str, ...] = (),
    **kw: Any,
) -> Run:
    """A run as the engine creates it (a singleton run carries its key's tag and
    ``singleton_key``); extra keywords set bookkeeping fields directly."""
    all_tags = ((tag_of(key),) if key else ()) + tags
    return Run(
        id=run_id,
        workflow=wf,
        workflow_version="1",
        status=status,
        input={"n": 1, "name": run_id},
        tags=all_tags,
        created_at=t,
        updated_at=kw.pop("updated_at", t),
        singleton_key=key,
        **kw,
    )


def started(run: Run) -> list[Event]:
    return [
        RunStarted(
            at=run.created_at,
            workflow=run.workflow,
            version=run.workflow_version,
            input=run.input,
            tags=list(run.tags),
        )
    ]


def numbered(events: Sequence[Event]) -> list[Event]:
    """``events`` as a store returns them: ``seq`` 1..n."""
    return [e.model_copy(update={"seq": i}) for i, e in enumerate(events, start=1)]


async def put(store: Store, run: Run) -> Run:
    """Create ``run`` with its ``run_started`` event; it must be new."""
    stored, created = await store.create_run(run, started(run))
    expect(created, f"create_run of new id {run.id!r} returned created=False")
    expect_eq(stored, run, f"create_run({run.id!r}) result")
    return stored


async def get(store: Store, run_id: str) -> Run:
    run = await store.get_run(run_id)
    if run is None:
        raise ConformanceError(f"get_run({run_id!r}) returned None for a run that exists")
    return run


async def state(store: Store, run_id: str) -> tuple[Run | None, list[Event]]:
    """Everything a failed operation must leave as it was."""
    return await store.get_run(run_id), await store.load_events(run_id)


async def admitted_ids(store: Store, key: str, wf: str = WF) -> list[str]:
    """Ids of the active runs of ``wf`` holding a slot of ``key``."""
    return [
        r.id
        for r in await store.list_runs(workflow=wf, tag=tag_of(key))
        if r.admitted and r.status.active
    ]


# -- assertions ------------------------------------------------------------------------------


def fail(message: str) -> NoReturn:
    raise ConformanceError(message)


def expect(condition: object, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def expect_eq(got: object, want: object, what: str) -> None:
    if got != want:
        raise ConformanceError(f"{what}: expected {want!r}, got {got!r}")


async def expect_raises(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    awaitable: Awaitable[Any],
    what: str,
) -> BaseException:
    """Await ``awaitable``; it must raise ``exc_type``."""
    names = (
        " or ".join(t.__name__ for t in exc_type)
        if isinstance(exc_type, tuple)
        else exc_type.__name__
    )
    try:
        result = await awaitable
    except exc_type as exc:
        return exc
    except Exception as exc:
        raise ConformanceError(
            f"{what}: expected {names}, got {type(exc).__name__}: {exc}"
        ) from exc
    raise ConformanceError(f"{what}: expected {names}, but it returned {result!r}")


async def expect_unchanged(
    store: Store, run_id: str, before: tuple[Run | None, Sequence[Event]], what: str
) -> None:
    run, events = await state(store, run_id)
    expect_eq(run, before[0], f"{what} must write nothing, but the run changed")
    expect_eq(
        [e.model_dump() for e in events],
        [e.model_dump() for e in before[1]],
        f"{what} must write nothing, but the history changed",
    )


def fired(at: float, pos: str = "0") -> TimerFired:
    """A ``timer_fired`` record at ``pos``."""
    return TimerFired(pos=pos, at=at)


__all__ = [
    "T0",
    "WF",
    "ConformanceError",
    "PairFactory",
    "StoreFactory",
]
