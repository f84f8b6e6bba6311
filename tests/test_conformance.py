"""The store conformance kit (``flowkit_testing.conformance``): every check passes on
MemoryStore, SqlStore on SQLite files, SqlStore on a throwaway PostgreSQL (tests/pg.py) and
CodecStore (AES-GCM) over SqlStore on SQLite, one pytest test per check; deliberately broken
stores fail the checks that guard what they break; checks of an optional capability
(``admits_on_create``, ``appends_events``) are skipped for a store, or a CodecStore over a
store, without it; ``run_all`` reports; and the kit never imports pytest."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowkit import ADMITTED_TAG
from flowkit import singleton as sg
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore, SqlStore
from flowkit.stores.base import AdmittedAt, Store, Update, admission_time
from flowkit.stores.rules import admit_new, admitted_event
from flowkit_testing.conformance import CHECKS, ConformanceError, run_all

try:
    from pg import drop_database, fresh_database
except ImportError:  # tests/ imported as a package
    from tests.pg import drop_database, fresh_database

ROOT = Path(__file__).resolve().parent.parent
PG = pytest.param("postgres", marks=pytest.mark.postgres)
KEY = bytes(range(32))


class Backend:
    """Store factories for the kit: every call gets fresh, empty data (a new SQLite file, a
    new PostgreSQL database); ``make_pair`` gives two store objects over one database."""

    def __init__(self, kind: str, new_url: Any = None) -> None:
        self.kind = kind
        self._new_url = new_url
        self._opened: list[SqlStore] = []

    def _sql(self, url: str) -> Store:
        store = SqlStore(url)
        self._opened.append(store)
        if self.kind == "codec":  # each store object with its own codec (another process)
            return CodecStore(store, AESGCMCodec([("k1", KEY)]))
        return store

    def make_store(self) -> Store:
        if self.kind == "memory":
            return MemoryStore()
        return self._sql(self._new_url())

    async def make_pair(self) -> tuple[Store, Store]:
        if self.kind == "memory":
            m = MemoryStore()
            return m, MemoryStore(_data=m._d)  # a second object over the same data
        url = self._new_url()
        return self._sql(url), self._sql(url)

    def close(self) -> None:
        for store in self._opened:
            store.close()
        if self.kind == "postgres":  # (the test is done with its databases)
            for url in dict.fromkeys(str(store.url) for store in self._opened):
                drop_database(url)


@pytest.fixture(params=["memory", "sqlite", PG, "codec"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    new_url: Any = None
    if kind in ("sqlite", "codec"):
        n = itertools.count()
        new_url = lambda: f"sqlite:///{tmp_path / f'conformance-{next(n)}.db'}"  # noqa: E731
    elif kind == "postgres":
        server = request.getfixturevalue("pg_server")
        new_url = lambda: fresh_database(server, "flowkit_conf")  # noqa: E731
    b = Backend(kind, new_url)
    yield b
    b.close()


@pytest.mark.parametrize("name", list(CHECKS))
async def test_store_conforms(backend: Backend, name: str) -> None:
    await CHECKS[name].run(backend.make_store, backend.make_pair)


# -- the kit itself --------------------------------------------------------------------------


def test_registry_covers_every_check_function() -> None:
    import flowkit_testing.conformance as kit

    funcs = {n.removeprefix("check_") for n in kit.__all__ if n.startswith("check_")}
    assert funcs == set(CHECKS)
    assert all(CHECKS[n].doc for n in CHECKS)
    kinds = {n: CHECKS[n].kind for n in CHECKS}
    assert {n for n, k in kinds.items() if k == "pair"} == {
        "competing_create_run",
        "competing_claims",
        "competing_commits",
        "competing_admissions",
        "competing_create_admissions",
        "competing_schedule_advances",
        "competing_publish_and_take",
        "change_stamp_sees_other_writers",
    }
    # plain checks first, then those needing optional methods, then the competing ones
    order = [(c.kind == "pair", bool(c.requires)) for c in CHECKS.values()]
    assert order == sorted(order)
    appends = {n for n, c in CHECKS.items() if "appends_events" in c.requires}
    assert appends == {
        "append_events_continues_the_numbering",
        "append_events_changes_only_the_history",
        "append_events_fenced_by_owner_not_expiry",
        "refused_append_events_writes_nothing",
        "append_events_respects_namespaces",
    }
    published = {n for n, c in CHECKS.items() if "publishes_events" in c.requires}
    assert published == {
        "publish_delivers_to_every_matching_waiter",
        "publish_buffers_once_for_the_first_later_waiter",
        "publish_dedupes_event_ids",
        "take_without_wait_drops_the_registration",
        "dropped_wait_gives_back_its_event",
        "competing_publish_and_take",
    }
    assert all(CHECKS[n].requires == ("publishes_events",) for n in published)
    assert {n for n, c in CHECKS.items() if c.requires and not c.singleton} == {
        "namespace_scoping",
        "release_leases",
        "release_leases_counts_lost_activations",
        "next_due_after",
        *appends,
        "claim_by_version",
        "due_runs_by_version",
        "record_worker",
        "workflow_schemas",
        "continue_as_new_creates_the_successor",
        "continue_as_new_is_all_or_nothing",
        "continue_as_new_keeps_the_inbox",
        "latest_event_finds_the_newest_match",
        "schedule_rows",
        "due_schedules",
        "competing_schedule_advances",
        "schedules_respect_namespaces",
        *published,
        "prune_runs",
        "browse_runs_newest_first",
        "count_runs_matches_list_runs",
        "events_page_cuts_the_history",
        "change_stamp_sees_other_writers",
    }
    browsing = {n for n, c in CHECKS.items() if "browse_runs" in c.requires}
    assert browsing == {
        "browse_runs_newest_first",
        "count_runs_matches_list_runs",
        "lanes_follow_the_gate",
    }
    assert CHECKS["append_events_respects_namespaces"].requires == ("appends_events", "scoped")
    assert all(
        CHECKS[n].requires == ("appends_events",)
        for n in appends - {"append_events_respects_namespaces"}
    )
    on_create = {n for n, c in CHECKS.items() if "admits_on_create" in c.requires}
    assert on_create == {
        "create_admits_on_a_free_key",
        "create_gates_behind_holders",
        "create_admission_is_fifo_behind_waiters",
        "create_admission_of_an_existing_id_writes_nothing",
        "create_admission_respects_the_queue_cap",
        "competing_create_admissions",
        "admission_is_recorded_with_the_marker",
    }
    assert all(CHECKS[n].singleton for n in on_create)  # parked runs re-check with it
    recorded = {n for n, c in CHECKS.items() if "records_admission" in c.requires}
    assert recorded == {"admission_is_recorded_with_the_marker"}
    by_version = {n for n, c in CHECKS.items() if "claims_by_version" in c.requires}
    assert by_version == {
        "claim_by_version",
        "due_runs_by_version",
        "hand_over_only_to_a_version_of_the_releaser",
    }
    assert {n for n, c in CHECKS.items() if "records_workers" in c.requires} == {"record_worker"}
    schemas = {n for n, c in CHECKS.items() if "records_schemas" in c.requires}
    assert schemas == {"workflow_schemas"}
    assert {n for n, c in CHECKS.items() if "claims_gated" in c.requires} == {
        "gated_claim_denied_writes_only_the_next_recheck",
        "gated_claim_admits_and_claims",
    }
    assert {n for n, c in CHECKS.items() if "continues_as_new" in c.requires} == {
        "continue_as_new_creates_the_successor",
        "continue_as_new_is_all_or_nothing",
        "continue_as_new_keeps_the_inbox",
        "continue_as_new_passes_the_slot",
    }
    schedules = {n for n, c in CHECKS.items() if "keeps_schedules" in c.requires}
    assert schedules == {
        "schedule_rows",
        "due_schedules",
        "competing_schedule_advances",
        "schedules_respect_namespaces",
    }


async def test_run_all_returns_every_check_name() -> None:
    async def make_store() -> Store:  # async factories work too
        return MemoryStore()

    assert await run_all(make_store) == list(CHECKS)
    assert await run_all(MemoryStore, checks=["renew_lease", "claim_exclusive"]) == [
        "renew_lease",
        "claim_exclusive",
    ]
    with pytest.raises(ValueError, match="no_such_check"):
        await run_all(MemoryStore, checks=["no_such_check"])


class NoSingletonStore(MemoryStore):
    """A store without singleton support (allowed: docs/singleton.md), nor namespaces, nor a way to
    give back a restarted worker's leases."""

    try_admit_singleton = None  # type: ignore[assignment]
    scoped = None  # type: ignore[assignment]
    release_leases = None  # type: ignore[assignment]


async def test_run_all_skips_checks_of_optional_methods_the_store_lacks() -> None:
    ran = await run_all(NoSingletonStore)
    # (it keeps the capabilities of a MemoryStore: those that need no optional method run)
    kept = {
        "admits_on_create",
        "appends_events",
        "next_due_after",
        "claims_by_version",
        "records_workers",
        "records_schemas",
        "continues_as_new",
        "latest_event",
        "keeps_schedules",
        "publishes_events",
        "prune_runs",
        "browse_runs",
        "events_page",
        "change_stamp",
    }
    assert ran == [n for n, c in CHECKS.items() if set(c.requires) <= kept]
    assert "next_due_after" in ran
    assert "append_events_continues_the_numbering" in ran
    assert "append_events_respects_namespaces" not in ran
    assert "admission_respects_limit" not in ran and "namespace_scoping" not in ran
    assert "release_leases" not in ran and "release_leases" in await run_all(MemoryStore)
    assert "competing_claims" in ran
    with pytest.raises(ConformanceError, match="admission_respects_limit"):
        await run_all(NoSingletonStore, singleton=True, checks=["admission_respects_limit"])
    assert "admission_respects_limit" not in await run_all(MemoryStore, singleton=False)


class NoAdmissionOnCreateStore(MemoryStore):
    """A store with singleton admission but without admission at creation."""

    admits_on_create = False


async def test_run_all_skips_the_admission_at_creation_checks_without_the_capability() -> None:
    ran = await run_all(NoAdmissionOnCreateStore)
    on_create = [n for n, c in CHECKS.items() if "admits_on_create" in c.requires]
    assert ran == [n for n in CHECKS if n not in on_create]
    assert "admission_respects_limit" in ran
    # a CodecStore over it does not claim the capability either; over a MemoryStore it does
    wrapped = CodecStore(NoAdmissionOnCreateStore(), AESGCMCodec([("k1", KEY)]))
    assert not wrapped.admits_on_create
    assert CodecStore(MemoryStore(), AESGCMCodec([("k1", KEY)])).admits_on_create
    assert await run_all(lambda: wrapped, checks=on_create) == []
    # insisting on the singleton checks does not insist on a capability the store lacks
    assert await run_all(NoAdmissionOnCreateStore, singleton=True, checks=on_create) == []


class NoAppendEventsStore(MemoryStore):
    """A store whose steps are recorded by ``commit``: ``appends_events`` is false (its
    inherited ``append_events`` is never called then)."""

    appends_events = False


class AbsentAppendEventsStore:
    """Forwards everything but ``appends_events`` and ``append_events`` to a MemoryStore."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name in ("appends_events", "append_events"):
            raise AttributeError(name)
        return getattr(self._inner, name)


APPENDS = [n for n, c in CHECKS.items() if "appends_events" in c.requires]


@pytest.mark.parametrize("store_cls", [NoAppendEventsStore, AbsentAppendEventsStore])
async def test_run_all_skips_the_append_checks_without_the_capability(store_cls: type) -> None:
    assert len(APPENDS) == 5
    ran = await run_all(store_cls)
    assert ran == [n for n in CHECKS if n not in APPENDS]
    assert "admission_respects_limit" in ran and "namespace_scoping" in ran
    assert await run_all(store_cls, checks=APPENDS) == []
    assert await run_all(store_cls, singleton=True, checks=APPENDS) == []
    # a CodecStore over it does not claim the capability either; over a MemoryStore it does
    wrapped = CodecStore(store_cls(), AESGCMCodec([("k1", KEY)]))
    assert wrapped.appends_events is False
    assert await run_all(lambda: wrapped, checks=APPENDS) == []
    assert CodecStore(MemoryStore(), AESGCMCodec([("k1", KEY)])).appends_events is True
    over_memory = lambda: CodecStore(MemoryStore(), AESGCMCodec([("k1", KEY)]))  # noqa: E731
    assert await run_all(over_memory, checks=APPENDS) == APPENDS


def test_the_kit_does_not_import_pytest() -> None:
    code = (
        "import sys; sys.modules['pytest'] = None; sys.modules['_pytest'] = None\n"
        "import asyncio\n"
        "from flowkit.stores import MemoryStore\n"
        "from flowkit_testing.conformance import run_all\n"
        "print(len(asyncio.run(run_all(MemoryStore))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(len(CHECKS))


# -- broken stores fail the checks that guard what they break --------------------------------


class AdmitsOneTooMany(MemoryStore):
    """Hands out ``limit + 1`` slots."""

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        **kw: Any,
    ) -> bool:
        return await super().try_admit_singleton(
            run_id, tag, workflow, limit + 1, retry_wake_at, **kw
        )


class ForgetsFencing(MemoryStore):
    """Lets anyone commit, whoever holds the lease."""

    async def commit(self, run_id: str, owner: str | None, now: float, update: Update) -> Any:
        return await super().commit(
            run_id, None, now, dataclasses.replace(update, ignore_lease=True)
        )


class RacyAdmission(MemoryStore):
    """Reads the key's runs, yields to the loop, then writes: not serialized per key."""

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: AdmittedAt = None,
    ) -> bool:
        runs = self._sharing(workflow, tag)
        tags = sg.admission_tags(runs, run_id, tag, workflow, limit)
        await asyncio.sleep(0)
        run = self._get(run_id)
        if tags is not None:
            self._put(dataclasses.replace(run, tags=tuple(tags)))
            at = admission_time(admitted_at)
            if at is not None and ADMITTED_TAG not in run.tags:
                self._append(run_id, [admitted_event(tag, at)])
            return True
        patch = sg.denial_patch(runs, run_id, tag, workflow, retry_wake_at)
        if patch:
            self._put(dataclasses.replace(run, **patch))
        return False


class ForgetsStickyCancel(MemoryStore):
    """Lets a non-terminal status replace ``cancelling``."""

    async def commit(self, run_id: str, owner: str | None, now: float, update: Update) -> Any:
        was = self._get(run_id).status
        res = await super().commit(run_id, owner, now, update)
        if was.value == "cancelling" and update.status is not None and update.status.active:
            run = dataclasses.replace(res.run, status=update.status)
            self._put(run)
            res = dataclasses.replace(res, run=run)
        return res


class AdmitsOnCreateIgnoringWaiters(MemoryStore):
    """Admits a new run whenever a slot is free, ignoring older waiters of the key."""

    async def create_run(self, run: Any, events: Any, **kw: Any) -> Any:
        adm = kw.get("admission")
        if adm is not None and run.id not in self._d.runs:
            held = len(sg.holders(self._sharing(adm.workflow, adm.tag), adm.tag, adm.workflow))
            if held < adm.limit:
                run = dataclasses.replace(run, tags=(*run.tags, ADMITTED_TAG))
                kw["admission"] = None
        return await super().create_run(run, events, **kw)


class RacyCreateAdmission(MemoryStore):
    """Decides the admission at creation, yields to the loop, then inserts: not serialized
    per key."""

    async def create_run(self, run: Any, events: Any, **kw: Any) -> Any:
        adm = kw.pop("admission", None)
        if adm is None or run.id in self._d.runs:
            return await super().create_run(run, events, **kw)
        decided, evs = admit_new(run, events, adm, self._sharing(adm.workflow, adm.tag))
        await asyncio.sleep(0)
        return await super().create_run(decided, evs, **kw)


class GatesAnExistingRun(MemoryStore):
    """Appends the gated events to an existing run on a repeated create."""

    async def create_run(self, run: Any, events: Any, **kw: Any) -> Any:
        adm = kw.get("admission")
        existing = self._d.runs.get(run.id)
        if adm is not None and existing is not None and not existing.admitted:
            self._append(run.id, adm.gated)
        return await super().create_run(run, events, **kw)


class AppendsForAnyOwner(MemoryStore):
    """Appends to a running run whoever holds its lease."""

    async def append_events(self, run_id: str, owner: str, now: float, events: Any) -> Any:
        run = self._d.runs.get(run_id)
        holder = run.lease_owner if run is not None and run.lease_owner else owner
        return await super().append_events(run_id, holder, now, events)


class AppendsToCancellingRuns(MemoryStore):
    """Appends for the lease holder of a ``cancelling`` run too."""

    async def append_events(self, run_id: str, owner: str, now: float, events: Any) -> Any:
        run = self._d.runs.get(run_id)
        if run is not None and run.status.value == "cancelling" and run.lease_owner == owner:
            return self._append(run_id, events) if events else None
        return await super().append_events(run_id, owner, now, events)


class AppendTouchesRefusedRuns(MemoryStore):
    """Moves ``updated_at`` before it decides, so a refused append writes too."""

    async def append_events(self, run_id: str, owner: str, now: float, events: Any) -> Any:
        run = self._d.runs.get(run_id)
        if run is not None and now > run.updated_at:
            self._d.runs[run_id] = dataclasses.replace(run, updated_at=now)
        return await super().append_events(run_id, owner, now, events)


class AppendForgetsLastSeq(MemoryStore):
    """Numbers the events of ``create_run`` and ``commit`` after the last seq it counted,
    which ``append_events`` forgets to advance (as a SQL store forgetting ``last_seq``): a
    commit after an append reuses the appended seqs."""

    _appending = False

    def _appended(self) -> dict[str, int]:
        counts: dict[str, int] = self._d.__dict__.setdefault("appended", {})
        return counts

    async def append_events(self, run_id: str, owner: str, now: float, events: Any) -> Any:
        self._appending = True
        try:
            seqs = await super().append_events(run_id, owner, now, events)
        finally:
            self._appending = False
        if seqs:
            self._appended()[run_id] = self._appended().get(run_id, 0) + len(seqs)
        return seqs

    def _append(self, run_id: str, events: Any) -> tuple[int, ...]:
        if self._appending:
            return super()._append(run_id, events)
        log = self._d.events.setdefault(run_id, [])
        last = len(log) - self._appended().get(run_id, 0)
        seqs = tuple(range(last + 1, last + 1 + len(events)))
        log.extend(e.model_copy(update={"seq": q}) for e, q in zip(events, seqs, strict=True))
        return seqs


def _pair_of(cls: type[MemoryStore]) -> Any:
    def pair() -> tuple[Store, Store]:
        m = cls()
        return m, cls(_data=m._d)

    return pair


BROKEN = [
    pytest.param(
        AdmitsOneTooMany,
        {"admission_respects_limit", "admission_fifo_keeps_holders", "competing_admissions"},
        "admitted",
        id="admits-one-too-many",
    ),
    pytest.param(
        ForgetsFencing,
        {"commit_lease_fencing", "competing_claims"},
        "LeaseLostError",
        id="forgets-fencing",
    ),
    pytest.param(RacyAdmission, {"competing_admissions"}, "admissions racing", id="racy-admission"),
    pytest.param(
        ForgetsStickyCancel, {"cancelling_is_sticky"}, "cancelling", id="forgets-sticky-cancel"
    ),
    pytest.param(
        AdmitsOnCreateIgnoringWaiters,
        {"create_admission_is_fifo_behind_waiters", "create_admission_respects_the_queue_cap"},
        "behind the older waiter",
        id="admits-on-create-ignoring-waiters",
    ),
    pytest.param(
        RacyCreateAdmission,
        {"competing_create_admissions"},
        "competing creates",
        id="racy-create-admission",
    ),
    pytest.param(
        GatesAnExistingRun,
        {"create_admission_of_an_existing_id_writes_nothing"},
        "must write nothing",
        id="gates-an-existing-run",
    ),
    pytest.param(
        AppendsForAnyOwner,
        {"refused_append_events_writes_nothing", "append_events_fenced_by_owner_not_expiry"},
        "an instance not holding the lease",
        id="appends-for-any-owner",
    ),
    pytest.param(
        AppendsToCancellingRuns,
        {"refused_append_events_writes_nothing"},
        "cancelling run",
        id="appends-to-cancelling-runs",
    ),
    pytest.param(
        AppendTouchesRefusedRuns,
        # (not append_events_respects_namespaces: its scoped views are plain MemoryStores)
        {"refused_append_events_writes_nothing", "append_events_fenced_by_owner_not_expiry"},
        "must write nothing, but the run changed",
        id="append-touches-refused-runs",
    ),
    pytest.param(
        AppendForgetsLastSeq,
        {"append_events_continues_the_numbering", "append_events_fenced_by_owner_not_expiry"},
        "it must continue after them",
        id="append-forgets-last-seq",
    ),
]


@pytest.mark.parametrize(("store_cls", "must_fail", "hint"), BROKEN)
async def test_broken_store_fails_the_relevant_checks(
    store_cls: type[MemoryStore], must_fail: set[str], hint: str
) -> None:
    failed: dict[str, str] = {}
    for name, chk in CHECKS.items():
        try:
            await chk.run(store_cls, _pair_of(store_cls))
        except ConformanceError as exc:
            failed[name] = str(exc)
    assert must_fail <= set(failed), failed
    for name in must_fail:
        assert failed[name].startswith(f"{name}: "), failed[name]
    assert any(hint in failed[n] for n in must_fail), failed
    assert len(failed) < len(CHECKS) // 2, f"the kit should pinpoint the bug: {sorted(failed)}"
    with pytest.raises(ConformanceError) as ei:
        await run_all(store_cls, _pair_of(store_cls))
    report = str(ei.value)
    assert f"{len(failed)} of {len(CHECKS)} store conformance checks failed" in report
    assert all(f"  - {name}: " in report for name in failed)


async def test_a_fenced_off_commit_message_is_clear() -> None:
    with pytest.raises(ConformanceError) as ei:
        await CHECKS["commit_lease_fencing"].run(ForgetsFencing)
    msg = str(ei.value)
    assert msg.startswith("commit_lease_fencing: commit by an instance that never held")
    assert "expected LeaseLostError" in msg
