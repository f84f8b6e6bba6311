"""The check registry: ``@check`` records a check function under its short name."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from flowkit.stores.base import claims_by_version, claims_gated, records_admission

from ._support import (
    ConformanceError,
    PairFactory,
    StoreFactory,
    make_store,
    same_store_pair,
)

CheckFn = Callable[[Any], Awaitable[None]]
F = TypeVar("F", bound=CheckFn)

OPTIONAL_METHODS = (
    "try_admit_singleton",
    "scoped",
    "release_leases",
    "next_due_after",
    "latest_event",
    "prune_runs",
    "browse_runs",
    "events_page",
    "change_stamp",
)
"""Store methods the contract lets a store leave out (absent or ``None``)."""
OPTIONAL_CAPABILITIES = (
    "admits_on_create",
    "appends_events",
    "records_admission",
    "claims_by_version",
    "claims_gated",
    "records_workers",
    "records_schemas",
    "continues_as_new",
    "keeps_schedules",
    "publishes_events",
)
"""Store flags the contract lets a store leave out (absent or false): ``admits_on_create``
(``create_run`` takes an ``Admission``), ``appends_events`` (``append_events`` records a
running step), ``claims_by_version`` (``claim``/``due_runs`` take ``versions``) and
``records_workers`` (``record_worker``/``workers``), ``records_schemas``
(``put_workflow_schemas``/``workflow_schema``), ``claims_gated`` (``claim`` takes
``gate``: a gated waiter's re-check decided in the claim), ``continues_as_new`` (``commit`` takes
``Update.successor``), ``keeps_schedules`` (durable schedules: ``flowkit.stores.schedules``),
``publishes_events`` (``publish_event``/``take_event``)."""


@dataclass(frozen=True)
class Check:
    """One conformance check.

    ``kind`` says what ``func`` takes: ``"store"`` checks take ``make_store``, ``"pair"``
    checks take ``make_pair`` (two store objects over the same data). ``requires`` names the
    optional store methods and capabilities the check needs (``try_admit_singleton``,
    ``scoped``, ``next_due_after``, ``admits_on_create``, ``appends_events``)."""

    name: str
    func: CheckFn
    kind: Literal["store", "pair"]
    requires: tuple[str, ...]
    doc: str

    @property
    def singleton(self) -> bool:
        """Whether the check needs ``try_admit_singleton``."""
        return "try_admit_singleton" in self.requires

    async def run(self, make_store: StoreFactory, make_pair: PairFactory | None = None) -> None:
        """Run the check; a pair check without ``make_pair`` gets one store object twice."""
        if self.kind == "pair":
            await self.func(make_pair if make_pair is not None else same_store_pair(make_store))
        else:
            await self.func(make_store)


CHECKS: dict[str, Check] = {}
"""Every check, by name, in the order they run."""


def check(
    *, kind: Literal["store", "pair"] = "store", requires: Iterable[str] = ()
) -> Callable[[F], F]:
    """Register the decorated ``check_<name>`` function as ``CHECKS["<name>"]``; the
    function returned prefixes its ``ConformanceError`` messages with the check's name."""
    needs = tuple(requires)
    unknown = set(needs) - set(OPTIONAL_METHODS) - set(OPTIONAL_CAPABILITIES)
    if unknown:
        raise ValueError(f"unknown optional store methods {sorted(unknown)}")

    def register(fn: F) -> F:
        name = fn.__name__.removeprefix("check_")
        if name in CHECKS:
            raise ValueError(f"duplicate conformance check {name!r}")

        @functools.wraps(fn)
        async def wrapper(factory: Any) -> None:
            try:
                await fn(factory)
            except ConformanceError as exc:
                msg = str(exc)
                if not msg.startswith(f"{name}: "):
                    exc.args = (f"{name}: {msg}",)
                raise

        doc = (fn.__doc__ or "").strip()
        CHECKS[name] = Check(name, wrapper, kind, needs, doc)
        return cast(F, wrapper)

    return register


def sort_checks() -> None:
    """Order ``CHECKS``: plain store checks, those needing optional methods, then the
    competing ones (definition order within each group)."""
    ordered = sorted(CHECKS.values(), key=lambda c: (c.kind == "pair", bool(c.requires)))
    CHECKS.clear()
    CHECKS.update((c.name, c) for c in ordered)


async def optional_methods(factory: StoreFactory) -> set[str]:
    """The optional methods (present, not ``None``) and capabilities (true) a store from
    ``factory`` has."""
    store = await make_store(factory)
    have = {m for m in OPTIONAL_METHODS if getattr(store, m, None) is not None}
    have |= {c for c in OPTIONAL_CAPABILITIES if getattr(store, c, False)}
    if not records_admission(store):  # (it says so, and its try_admit_singleton agrees)
        have.discard("records_admission")
    if not claims_by_version(store):  # (likewise its claim and due_runs)
        have.discard("claims_by_version")
    if not claims_gated(store):  # (likewise its claim)
        have.discard("claims_gated")
    return have
