"""Store conformance kit: plain async checks that any flowkit store can run.

Each ``check_*`` function takes a factory and raises ``ConformanceError`` (an
``AssertionError``) naming what the store did wrong. Most take ``make_store``, a callable that
returns a fresh, empty, unscoped store (or an awaitable of one); the competing checks take
``make_pair``, a callable that returns two store objects over the same fresh data (two
processes' views: for a SQL store, two store objects on one new database). Nothing here
imports pytest: run the checks from any test runner, or all at once::

    from flowkit_testing.conformance import run_all

    names = await run_all(lambda: MyStore(fresh_url()), make_pair=my_pair_factory)

``CHECKS`` maps each check's name to a ``Check`` (``.run(make_store, make_pair)``, ``.kind``,
``.requires``, ``.singleton``, ``.doc``), handy to parametrize one test per check. The kit
never closes the stores it gets; track them in the factory and close them after the test."""

from __future__ import annotations

from collections.abc import Iterable

from ._appends import (
    check_append_events_changes_only_the_history,
    check_append_events_continues_the_numbering,
    check_append_events_fenced_by_owner_not_expiry,
    check_append_events_respects_namespaces,
    check_refused_append_events_writes_nothing,
)
from ._browse import (
    check_browse_runs_newest_first,
    check_change_stamp_sees_other_writers,
    check_count_runs_matches_list_runs,
    check_events_page_cuts_the_history,
    check_lanes_follow_the_gate,
)
from ._commits import (
    check_commit_applies_update,
    check_commit_lease_fencing,
    check_consumed_signal_conflict_writes_nothing,
    check_event_seqs_gap_free,
    check_expect_status_conflict_writes_nothing,
)
from ._competing import (
    check_competing_admissions,
    check_competing_claims,
    check_competing_commits,
    check_competing_create_admissions,
    check_competing_create_run,
)
from ._continues import (
    check_continue_as_new_creates_the_successor,
    check_continue_as_new_is_all_or_nothing,
    check_continue_as_new_keeps_the_inbox,
    check_continue_as_new_passes_the_slot,
)
from ._events import (
    check_competing_publish_and_take,
    check_dropped_wait_gives_back_its_event,
    check_publish_buffers_once_for_the_first_later_waiter,
    check_publish_dedupes_event_ids,
    check_publish_delivers_to_every_matching_waiter,
    check_take_without_wait_drops_the_registration,
)
from ._heads import check_only_heads_hold_a_timer, check_the_next_head_gets_a_timer
from ._leases import (
    check_cancelling_is_sticky,
    check_claim_exclusive,
    check_claimable_rules,
    check_release_leases,
    check_renew_lease,
    check_terminal_commit_clears_bookkeeping,
)
from ._limits import (
    check_identifier_limits,
    check_payload_size_limit,
    check_signal_name_limits,
    check_unstorable_values_refused,
)
from ._on_create import (
    check_admission_is_recorded_with_the_marker,
    check_create_admission_is_fifo_behind_waiters,
    check_create_admission_of_an_existing_id_writes_nothing,
    check_create_admission_respects_the_queue_cap,
    check_create_admits_on_a_free_key,
    check_create_gates_behind_holders,
)
from ._published import check_latest_event_finds_the_newest_match
from ._recheck import (
    check_gated_claim_admits_and_claims,
    check_gated_claim_denied_writes_only_the_next_recheck,
)
from ._recoveries import (
    check_claim_counts_lost_activations,
    check_dead_is_terminal,
    check_release_leases_counts_lost_activations,
    check_retry_sets_input_deadline_and_recoveries,
)
from ._registry import (
    CHECKS,
    OPTIONAL_CAPABILITIES,
    OPTIONAL_METHODS,
    Check,
    optional_methods,
    sort_checks,
)
from ._runs import (
    check_create_run_idempotent,
    check_create_run_writes_its_events,
    check_id_ties_by_code_point,
    check_list_runs_by_parent,
    check_list_runs_order_and_filters,
    check_queue_cap_rejection_writes_nothing,
)
from ._schedules import (
    check_competing_schedule_advances,
    check_due_schedules,
    check_schedule_rows,
    check_schedules_respect_namespaces,
)
from ._search import check_prune_runs, check_search_attributes_filter_and_page
from ._singleton import (
    check_admission_fifo_keeps_holders,
    check_admission_marker_persisted,
    check_admission_rejects_a_limit_below_one,
    check_admission_respects_limit,
    check_admission_skips_cancelling_and_terminal,
    check_admission_ties_by_code_point,
    check_denial_parks_waiter,
    check_notify_hands_the_slot_over,
    check_notify_wakes_oldest_waiters,
)
from ._support import ConformanceError, PairFactory, StoreFactory
from ._values import (
    check_microsecond_timestamps,
    check_namespace_scoping,
    check_payloads_round_trip,
)
from ._versions import (
    check_claim_by_version,
    check_due_runs_by_version,
    check_hand_over_only_to_a_version_of_the_releaser,
    check_record_worker,
    check_workflow_schemas,
)
from ._waits import (
    check_deliver_signal_wakes_waiter,
    check_due_runs_and_next_due_at,
    check_next_due_after,
    check_signal_peek_fifo,
)

sort_checks()


async def run_all(
    make_store: StoreFactory,
    make_pair: PairFactory | None = None,
    *,
    checks: Iterable[str] | None = None,
    singleton: bool | None = None,
) -> list[str]:
    """Run every check (or the named ``checks``) and return the names of those that ran.

    Without ``make_pair`` the competing checks run on one store object used twice (still
    concurrent through ``asyncio.gather``, but not two connections). Checks that need an
    optional store method (``try_admit_singleton``, ``scoped``, ``release_leases``,
    ``next_due_after``, ``latest_event``, ``prune_runs``, ``browse_runs``, ``change_stamp``) or
    capability (``admits_on_create``, ``appends_events``,
    ``records_admission``) run only when a store from
    ``make_store`` has it; ``singleton=True``/``False`` forces the singleton checks in or out
    (those of admission at creation still need ``admits_on_create``). Every selected check
    runs; if any fail, one ``ConformanceError`` lists them all (chained to the first
    failure)."""
    selected = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown conformance checks: {', '.join(unknown)}")
    available = {*OPTIONAL_METHODS, *OPTIONAL_CAPABILITIES}
    if any(CHECKS[n].requires for n in selected):
        available = await optional_methods(make_store)
    if singleton is not None:
        available.discard("try_admit_singleton")
        if singleton:
            available.add("try_admit_singleton")
    ran: list[str] = []
    failures: list[tuple[str, BaseException]] = []
    for name in selected:
        chk = CHECKS[name]
        if not set(chk.requires) <= available:
            continue
        ran.append(name)
        try:
            await chk.run(make_store, make_pair)
        except Exception as exc:
            failures.append((name, exc))
    if failures:
        lines = [
            f"{len(failures)} of {len(ran)} store conformance checks failed:",
            *(
                f"  - {exc}"
                if isinstance(exc, ConformanceError)
                else f"  - {name}: {type(exc).__name__}: {exc}"
                for name, exc in failures
            ),
        ]
        raise ConformanceError("\n".join(lines)) from failures[0][1]
    return ran


__all__ = [
    "CHECKS",
    "Check",
    "ConformanceError",
    "PairFactory",
    "StoreFactory",
    "check_admission_fifo_keeps_holders",
    "check_admission_is_recorded_with_the_marker",
    "check_admission_marker_persisted",
    "check_admission_rejects_a_limit_below_one",
    "check_admission_respects_limit",
    "check_admission_skips_cancelling_and_terminal",
    "check_admission_ties_by_code_point",
    "check_append_events_changes_only_the_history",
    "check_append_events_continues_the_numbering",
    "check_append_events_fenced_by_owner_not_expiry",
    "check_append_events_respects_namespaces",
    "check_browse_runs_newest_first",
    "check_cancelling_is_sticky",
    "check_change_stamp_sees_other_writers",
    "check_claim_by_version",
    "check_claim_counts_lost_activations",
    "check_claim_exclusive",
    "check_claimable_rules",
    "check_commit_applies_update",
    "check_commit_lease_fencing",
    "check_competing_admissions",
    "check_competing_claims",
    "check_competing_commits",
    "check_competing_create_admissions",
    "check_competing_create_run",
    "check_competing_publish_and_take",
    "check_competing_schedule_advances",
    "check_consumed_signal_conflict_writes_nothing",
    "check_continue_as_new_creates_the_successor",
    "check_continue_as_new_is_all_or_nothing",
    "check_continue_as_new_keeps_the_inbox",
    "check_continue_as_new_passes_the_slot",
    "check_count_runs_matches_list_runs",
    "check_create_admission_is_fifo_behind_waiters",
    "check_create_admission_of_an_existing_id_writes_nothing",
    "check_create_admission_respects_the_queue_cap",
    "check_create_admits_on_a_free_key",
    "check_create_gates_behind_holders",
    "check_create_run_idempotent",
    "check_create_run_writes_its_events",
    "check_dead_is_terminal",
    "check_deliver_signal_wakes_waiter",
    "check_denial_parks_waiter",
    "check_dropped_wait_gives_back_its_event",
    "check_due_runs_and_next_due_at",
    "check_due_runs_by_version",
    "check_due_schedules",
    "check_event_seqs_gap_free",
    "check_events_page_cuts_the_history",
    "check_expect_status_conflict_writes_nothing",
    "check_gated_claim_admits_and_claims",
    "check_gated_claim_denied_writes_only_the_next_recheck",
    "check_hand_over_only_to_a_version_of_the_releaser",
    "check_id_ties_by_code_point",
    "check_identifier_limits",
    "check_lanes_follow_the_gate",
    "check_latest_event_finds_the_newest_match",
    "check_list_runs_by_parent",
    "check_list_runs_order_and_filters",
    "check_microsecond_timestamps",
    "check_namespace_scoping",
    "check_next_due_after",
    "check_notify_hands_the_slot_over",
    "check_notify_wakes_oldest_waiters",
    "check_only_heads_hold_a_timer",
    "check_payload_size_limit",
    "check_payloads_round_trip",
    "check_prune_runs",
    "check_publish_buffers_once_for_the_first_later_waiter",
    "check_publish_dedupes_event_ids",
    "check_publish_delivers_to_every_matching_waiter",
    "check_queue_cap_rejection_writes_nothing",
    "check_record_worker",
    "check_refused_append_events_writes_nothing",
    "check_release_leases",
    "check_release_leases_counts_lost_activations",
    "check_renew_lease",
    "check_retry_sets_input_deadline_and_recoveries",
    "check_schedule_rows",
    "check_schedules_respect_namespaces",
    "check_search_attributes_filter_and_page",
    "check_signal_name_limits",
    "check_signal_peek_fifo",
    "check_take_without_wait_drops_the_registration",
    "check_terminal_commit_clears_bookkeeping",
    "check_the_next_head_gets_a_timer",
    "check_unstorable_values_refused",
    "check_workflow_schemas",
    "run_all",
]
