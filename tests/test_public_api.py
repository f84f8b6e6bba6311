"""Pins the public names the docs promise: removing or renaming one must fail here."""

import flowkit
import flowkit.errors
import flowkit.singleton
import flowkit_testing
from flowkit.stores import MemoryStore


def test_flowkit_exports_the_fixed_names() -> None:
    fixed = {
        "workflow",
        "WorkflowCtx",
        "Singleton",
        "RetryPolicy",
        "Engine",
        "History",
        "Run",
        "RunStatus",
        "replay",
        "FlowkitError",
        "SingletonQueueFullError",
        "UnsupportedStoreError",
        "NonDeterminismError",
        "WorkflowNotFoundError",
        "RunNotFoundError",
        "WorkflowFailedError",
        "RunCancelledError",
        "SignalTimeout",
        "StepFailedError",
        "StepTimeoutError",
        # docs/updates.md
        "Schedule",
        "update_validator",
        "UpdateRejectedError",
    }
    assert fixed <= set(flowkit.__all__)
    for name in flowkit.__all__:
        assert getattr(flowkit, name) is not None


def test_errors_share_one_root() -> None:
    for name in flowkit.errors.__all__:
        assert issubclass(getattr(flowkit.errors, name), flowkit.FlowkitError)
        assert getattr(flowkit, name, getattr(flowkit.errors, name)) is getattr(
            flowkit.errors, name
        )
    assert issubclass(flowkit.SignalTimeout, TimeoutError)


def test_status_values_and_helpers() -> None:
    assert [s.value for s in flowkit.RunStatus] == [
        "pending",
        "running",
        "suspended",
        "blocked",
        "cancelling",
        "completed",
        "failed",
        "cancelled",
        "dead",
    ]
    assert {s for s in flowkit.RunStatus if s.terminal} == {
        flowkit.RunStatus.COMPLETED,
        flowkit.RunStatus.FAILED,
        flowkit.RunStatus.CANCELLED,
        flowkit.RunStatus.DEAD,
    }
    assert callable(flowkit.singleton.admission_tags)
    assert callable(flowkit.singleton.denial_patch)
    assert callable(MemoryStore().try_admit_singleton)
    assert {"TestEnv", "VirtualClock"} <= set(flowkit_testing.__all__)


def test_store_capabilities_and_crash_points_are_exported() -> None:
    import flowkit.stores

    assert {"Admission", "AdmitsOnCreate", "AppendsEvents", "QueueCap", "Store"} <= set(
        flowkit.stores.__all__
    )
    assert flowkit.stores.AppendsEvents is flowkit.stores.base.AppendsEvents
    assert "AppendsEvents" in flowkit.stores.base.__all__
    assert MemoryStore.admits_on_create is True
    assert flowkit.stores.SqlStore.admits_on_create is True
    assert MemoryStore.appends_events is True
    assert flowkit.stores.SqlStore.appends_events is True
    assert flowkit.stores.CodecStore.appends_events is False  # true per instance, from inner
    assert {"CRASH_POINTS", "CRASH_SITES", "CrashSite"} <= set(flowkit_testing.__all__)
    # the (op, phase, matcher) form of the named points is kept; "after_admission" also
    # fires where admission now usually happens: in the start's create_run
    assert flowkit_testing.CRASH_POINTS["after_admission"][:2] == ("try_admit_singleton", "after")
    sites = flowkit_testing.CRASH_SITES["after_admission"]
    assert [(s.op, s.phase) for s in sites] == [
        ("try_admit_singleton", "after"),
        ("create_run", "after"),
    ]


# -- the exact public names: adding or removing one is a decision, made here on purpose --------

FLOWKIT = [
    "ADMITTED_TAG",
    "CallRefusedError",
    "ChildHandle",
    "ChildWorkflowError",
    "Clock",
    "Engine",
    "Event",
    "FlowkitError",
    "History",
    "HistoryError",
    "InvalidInputError",
    "NonDeterminismError",
    "NotFoundError",
    "ReplayError",
    "ReplayFailedError",
    "ReplayReport",
    "ReplayResult",
    "ResultTimeoutError",
    "RetryPolicy",
    "Run",
    "RunCancelledError",
    "RunNotCompletedError",
    "RunNotFoundError",
    "RunStateError",
    "RunStatus",
    "Schedule",
    "ScheduleNotFoundError",
    "Schedules",
    "SerializationError",
    "SignalTimeout",
    "SignalTimeoutError",
    "Singleton",
    "SingletonQueueFullError",
    "StepFailedError",
    "StepTimeoutError",
    "StoreError",
    "SystemClock",
    "UnsupportedStoreError",
    "UpdateNotRepliedError",
    "UpdateRejectedError",
    "UpdateRequest",
    "VersionMismatchError",
    "WorkflowCtx",
    "WorkflowDefinition",
    "WorkflowFailedError",
    "WorkflowNotFoundError",
    "replay",
    "replay_async",
    "replay_dir",
    "replay_dir_async",
    "update_validator",
    "workflow",
]  # fmt: skip
FLOWKIT_TESTING = [
    "CRASH_POINTS", "CRASH_SITES", "DEFAULT_START", "CrashSite", "FaultPlan", "InjectedFault",
    "InstanceCrashed", "Rule", "TestEnv", "VirtualClock",
]  # fmt: skip
FLOWKIT_STORES = [
    "AESGCMCodec", "Admission", "AdmitsOnCreate", "AppendsEvents", "Codec", "CodecError",
    "CodecStore", "CommitResult", "ConflictError", "ContinuesAsNew", "EncryptedStoreError",
    "HandOff", "InboxSignal", "KeepsSchedules", "MemoryStore", "NextDueAfter", "Notify",
    "PrunesRuns", "PublishedEvent", "PublishesEvents", "QueueCap", "RecordsAdmission",
    "ReleasesLeases", "ScheduleRecord", "SqlStore", "Store", "Successor", "TakenEvent", "Update",
]  # fmt: skip

FLOWKIT_STORES_LIMITS = [
    "DEFAULT_MAX_PAYLOAD_BYTES", "MAX_ERROR_TEXT_LENGTH", "MAX_EVENT_NAME_LENGTH",
    "MAX_NAMESPACE_LENGTH", "MAX_PATCH_ID_LENGTH", "MAX_RUN_ID_LENGTH", "MAX_SIGNAL_NAME_LENGTH",
    "MAX_SINGLETON_KEY_LENGTH", "MAX_TAG_LENGTH", "MAX_UPDATE_NAME_LENGTH",
    "MAX_WORKFLOW_NAME_LENGTH", "PAYLOAD_FIELDS", "check_event", "check_events", "check_identifier",
    "check_json", "check_run", "check_signal", "check_tag", "check_update", "error_text",
    "payload_limit", "storable",
]  # fmt: skip


def test_the_public_names_are_exactly_these_and_sorted() -> None:
    import flowkit.stores
    import flowkit.stores.limits

    for module, names in (
        (flowkit, FLOWKIT),
        (flowkit_testing, FLOWKIT_TESTING),
        (flowkit.stores, FLOWKIT_STORES),
        (flowkit.stores.limits, FLOWKIT_STORES_LIMITS),
    ):
        assert module.__all__ == names, module.__name__
        # (isort's order, as ruff keeps it: CONSTANTS, then Classes, then functions)
        assert names == sorted(names, key=lambda n: (0 if n.isupper() else 2 - n[0].isupper(), n))
        for name in names:
            assert getattr(module, name) is not None, (module.__name__, name)


def test_the_logging_module_exports_its_names() -> None:
    import logging

    import flowkit.logging

    assert set(flowkit.logging.__all__) == {
        "TAGS",
        "JsonFormatter",
        "WorkflowLogger",
        "logger_name",
    }
    assert issubclass(flowkit.logging.JsonFormatter, logging.Formatter)
    assert issubclass(flowkit.logging.WorkflowLogger, logging.LoggerAdapter)
    assert isinstance(flowkit.WorkflowCtx.logger, property)


def test_the_otel_module_exports_its_names() -> None:
    import flowkit.otel

    assert flowkit.otel.__all__ == [
        "OTHER_KEYS",
        "SCOPE",
        "Instrumentation",
        "instrument",
        "worker_setup",
    ]
    assert callable(flowkit.otel.instrument)
