"""The error tree groups errors by what the caller can do, keeps every old base class, and is
drawn truthfully in the ``flowkit.errors`` docstring (docs/writing-workflows.md, "Errors")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import flowkit
import flowkit.errors as fe
from flowkit import ReplayReport, WorkflowCtx, workflow
from flowkit_testing import InjectedFault, TestEnv

# -- every error, built as flowkit builds it -----------------------------------------------

SAMPLES: dict[str, BaseException] = {
    "FlowkitError": fe.FlowkitError("x"),
    "CallRefusedError": fe.CallRefusedError("x"),
    "NotFoundError": fe.NotFoundError("x"),
    "RunNotCompletedError": fe.RunNotCompletedError("x"),
    "ReplayError": fe.ReplayError("x"),
    "StoreError": fe.StoreError("x"),
    "InvalidInputError": fe.InvalidInputError("wf", "bad"),
    "SingletonQueueFullError": fe.SingletonQueueFullError("wf", "k", 0),
    "RunIdTakenError": fe.RunIdTakenError("r1"),
    "RunStateError": fe.RunStateError("r1", "completed", "no"),
    "UpdateRejectedError": fe.UpdateRejectedError("r1", "u", ValueError("no")),
    "WorkflowNotFoundError": fe.WorkflowNotFoundError("wf"),
    "VersionMismatchError": fe.VersionMismatchError("wf", "2", ("1",)),
    "RunNotFoundError": fe.RunNotFoundError("r1"),
    "ScheduleNotFoundError": fe.ScheduleNotFoundError("s1"),
    "WorkflowFailedError": fe.WorkflowFailedError("r1", {"type": "E"}, None),
    "RunCancelledError": fe.RunCancelledError("r1"),
    "ChildWorkflowError": fe.ChildWorkflowError("r2", "wf", None, "failed"),
    "NonDeterminismError": fe.NonDeterminismError(1, None, None),
    "HistoryError": fe.HistoryError("x"),
    "ReplayFailedError": flowkit.ReplayFailedError(ReplayReport(Path("h"), ())),
    "StoreUnavailableError": fe.StoreUnavailableError("x"),
    "UnsupportedStoreError": fe.UnsupportedStoreError("x"),
    "UnsupportedDatabaseError": fe.UnsupportedDatabaseError("x"),
    "NotAFlowkitDatabaseError": fe.NotAFlowkitDatabaseError("x"),
    "SchemaVersionError": fe.SchemaVersionError(9, 1),
    "CodecError": fe.CodecError("x"),
    "EncryptedStoreError": fe.EncryptedStoreError("x", marker="aesgcm kid=k"),
    "LeaseLostError": fe.LeaseLostError("r1"),
    "ConflictError": fe.ConflictError("x"),
    "StepFailedError": fe.StepFailedError("s", "E", "m", 1),
    "SerializationError": fe.SerializationError("x"),
    "UpdateNotRepliedError": fe.UpdateNotRepliedError("r1", "u", "completed"),
    "SignalTimeout": fe.SignalTimeout("go", 1.0),
    "ResultTimeoutError": fe.ResultTimeoutError("r1", "pending", 1.0),
    "StepTimeoutError": fe.StepTimeoutError("s", 1.0),
}

# What an ``except`` clause could name for each error before the groups existed (its ancestors
# then, past ``Exception``): every one of them must still catch it.
OLD_CATCHERS: dict[str, tuple[type[BaseException], ...]] = {
    "ChildWorkflowError": (fe.FlowkitError,),
    "CodecError": (fe.FlowkitError,),
    "ConflictError": (fe.FlowkitError,),
    "EncryptedStoreError": (fe.CodecError, fe.FlowkitError),
    "FlowkitError": (),
    "HistoryError": (fe.FlowkitError, ValueError),
    "InvalidInputError": (fe.FlowkitError, ValueError),
    "LeaseLostError": (fe.FlowkitError,),
    "NonDeterminismError": (fe.FlowkitError,),
    "NotAFlowkitDatabaseError": (fe.FlowkitError,),
    "ReplayFailedError": (fe.FlowkitError, AssertionError),
    "ResultTimeoutError": (fe.FlowkitError, TimeoutError, OSError),
    "RunCancelledError": (fe.FlowkitError,),
    "RunIdTakenError": (fe.FlowkitError,),
    "RunNotFoundError": (fe.FlowkitError, LookupError),
    "RunStateError": (fe.FlowkitError,),
    "ScheduleNotFoundError": (fe.FlowkitError, LookupError),
    "SchemaVersionError": (fe.FlowkitError,),
    "SerializationError": (fe.FlowkitError, TypeError),
    "SignalTimeout": (fe.FlowkitError, TimeoutError, OSError),
    "SingletonQueueFullError": (fe.FlowkitError,),
    "StepFailedError": (fe.FlowkitError,),
    "StepTimeoutError": (fe.FlowkitError, TimeoutError, OSError),
    "StoreUnavailableError": (fe.FlowkitError,),
    "UnsupportedDatabaseError": (fe.FlowkitError, ValueError),
    "UnsupportedStoreError": (fe.FlowkitError,),
    "UpdateNotRepliedError": (fe.FlowkitError,),
    "UpdateRejectedError": (fe.FlowkitError,),
    "VersionMismatchError": (fe.WorkflowNotFoundError, fe.FlowkitError, LookupError),
    "WorkflowFailedError": (fe.FlowkitError,),
    "WorkflowNotFoundError": (fe.FlowkitError, LookupError),
}

# The groups, and every error each one catches.
GROUPS: dict[type[BaseException], set[str]] = {
    fe.CallRefusedError: {
        "InvalidInputError",
        "SingletonQueueFullError",
        "RunIdTakenError",
        "RunStateError",
        "UpdateRejectedError",
    },
    fe.NotFoundError: {
        "WorkflowNotFoundError",
        "VersionMismatchError",
        "RunNotFoundError",
        "ScheduleNotFoundError",
    },
    fe.RunNotCompletedError: {"WorkflowFailedError", "RunCancelledError", "ChildWorkflowError"},
    fe.ReplayError: {
        "NonDeterminismError",
        "HistoryError",
        "ReplayFailedError",
        "VersionMismatchError",
    },
    fe.StoreError: {
        "StoreUnavailableError",
        "UnsupportedStoreError",
        "UnsupportedDatabaseError",
        "NotAFlowkitDatabaseError",
        "SchemaVersionError",
        "CodecError",
        "EncryptedStoreError",
        "LeaseLostError",
        "ConflictError",
    },
}
UNGROUPED = {
    "StepFailedError",
    "SerializationError",
    "UpdateNotRepliedError",
    "SignalTimeout",
    "ResultTimeoutError",
    "StepTimeoutError",
}


def error_class(name: str) -> type[BaseException]:
    cls = getattr(fe, name, None) or getattr(flowkit, name)
    assert isinstance(cls, type) and issubclass(cls, BaseException), name
    return cls


def defined_errors() -> set[str]:
    """The error classes ``flowkit.errors`` defines (an alias counts once), and the one error
    defined elsewhere that its tree draws."""
    found = {
        v.__name__
        for v in vars(fe).values()
        if isinstance(v, type)
        and issubclass(v, BaseException)
        and v.__module__.startswith("flowkit")
    }
    return found | {"ReplayFailedError"}


def test_every_error_has_a_sample_and_its_old_catchers() -> None:
    groups = {g.__name__ for g in GROUPS}
    assert set(SAMPLES) == defined_errors() == set(OLD_CATCHERS) | groups


@pytest.mark.parametrize("name", sorted(OLD_CATCHERS))
def test_every_except_clause_written_before_still_catches(name: str) -> None:
    sample = SAMPLES[name]
    assert type(sample) is error_class(name)
    for old in (*OLD_CATCHERS[name], fe.FlowkitError, Exception):
        try:
            raise sample
        except old as caught:  # the clause a user wrote before the groups
            assert caught is sample


def test_an_injected_fault_is_still_a_store_unavailable_error() -> None:
    fault = InjectedFault("down")
    assert isinstance(fault, fe.StoreUnavailableError)
    assert isinstance(fault, fe.StoreError)


@pytest.mark.parametrize("group", list(GROUPS), ids=lambda g: g.__name__)
def test_each_group_catches_exactly_its_errors(group: type[BaseException]) -> None:
    assert issubclass(group, fe.FlowkitError)
    assert group.__bases__[0] is fe.FlowkitError
    for name, sample in SAMPLES.items():
        if name in {g.__name__ for g in GROUPS} | {"FlowkitError"}:
            continue
        assert isinstance(sample, group) is (name in GROUPS[group]), (group.__name__, name)
    assert {n for n in SAMPLES if n not in {g.__name__ for g in GROUPS} | {"FlowkitError"}} == (
        set().union(*GROUPS.values()) | UNGROUPED
    )


def test_no_error_is_in_two_groups_except_a_version_mismatch() -> None:
    for name in SAMPLES:
        groups = [g.__name__ for g in GROUPS if isinstance(SAMPLES[name], g)]
        if name == "VersionMismatchError":
            # no workflow of that version (a lookup), found while replaying a history
            assert groups == ["NotFoundError", "ReplayError"]
        else:
            assert len(groups) <= 1, (name, groups)


def test_the_group_of_lookups_is_a_lookup_error_and_timeouts_are_timeout_errors() -> None:
    assert issubclass(fe.NotFoundError, LookupError)
    for name in ("SignalTimeout", "ResultTimeoutError", "StepTimeoutError"):
        assert isinstance(SAMPLES[name], TimeoutError)
        assert name in UNGROUPED


def test_signal_timeout_error_is_signal_timeout() -> None:
    assert fe.SignalTimeoutError is fe.SignalTimeout
    assert flowkit.SignalTimeoutError is flowkit.SignalTimeout is fe.SignalTimeout
    assert fe.SignalTimeout.__name__ == "SignalTimeout"  # what histories record
    assert {"SignalTimeout", "SignalTimeoutError"} <= set(fe.__all__) & set(flowkit.__all__)
    with pytest.raises(flowkit.SignalTimeout):
        raise flowkit.SignalTimeoutError("go", 1.0)


def test_run_outcomes_carry_the_run_id() -> None:
    for name in GROUPS[fe.RunNotCompletedError]:
        sample = SAMPLES[name]
        assert isinstance(sample, fe.RunNotCompletedError)
        assert sample.run_id in {"r1", "r2"}


# -- the docstring draws the tree the classes have -------------------------------------------

BRANCH = re.compile(r"^(?P<indent>[│ ]*)(?:├── |└── )(?P<name>\w+)(?P<text>.*)$")


def documented_tree() -> dict[str, tuple[str | None, str]]:
    """``name -> (parent, description)`` as the ``flowkit.errors`` docstring draws them."""
    doc = fe.__doc__
    assert doc is not None
    return parse_tree([line[4:] for line in doc.split("::\n", 1)[1].splitlines()])


def parse_tree(lines: list[str]) -> dict[str, tuple[str | None, str]]:
    """``name -> (parent, description)`` of a tree drawn with ``├──`` and ``└──``."""
    root, *rest = [line for line in lines if line.strip()]
    name = root.split()[0]
    tree: dict[str, tuple[str | None, str]] = {name: (None, root[len(name) :])}
    stack = [name]
    last = name
    for line in rest:
        m = BRANCH.match(line)
        if m is None:  # a description going on from the line above
            parent, text = tree[last]
            tree[last] = (parent, f"{text} {line.strip('│ ')}")
            continue
        depth = len(m["indent"]) // 4 + 1
        assert len(m["indent"]) % 4 == 0 and depth <= len(stack), line
        del stack[depth:]
        assert m["name"] not in tree, f"{m['name']} drawn twice"
        tree[m["name"]] = (stack[-1], m["text"])
        stack.append(m["name"])
        last = m["name"]
    return tree


def check_tree(tree: dict[str, tuple[str | None, str]]) -> None:
    """Every error class is drawn once, under its one base (the first), with the others noted
    "(also a ...)"; the alias is named where its class is drawn."""
    assert set(tree) == defined_errors()
    for name, (parent, text) in tree.items():
        also = [
            b.strip() for m in re.findall(r"\(also an? ([\w, ]+)[;)]", text) for b in m.split(",")
        ]
        bases = tuple(b.__name__ for b in error_class(name).__bases__)
        assert bases == ((parent or "Exception"), *also), name
    aliases = {a: n for n, (_, t) in tree.items() for a in re.findall(r"also named (\w+)", t)}
    assert aliases == {"SignalTimeoutError": "SignalTimeout"}
    for alias, name in aliases.items():
        assert getattr(fe, alias) is error_class(name)


def test_every_error_class_is_drawn_under_exactly_its_parents() -> None:
    tree = documented_tree()
    check_tree(tree)
    for name, (_, text) in tree.items():
        assert text.strip(), f"{name} says nothing about when it is raised"


def test_the_docs_draw_the_same_tree() -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "writing-workflows.md").read_text()
    errors = page[page.index("\n## Errors") :]
    drawn = errors[errors.index("```text\nFlowkitError") + len("```text\n") :]
    tree = parse_tree(drawn[: drawn.index("```")].splitlines())
    check_tree(tree)
    for group in GROUPS:  # and says what a caller does with each group
        assert f"* **`{group.__name__}`**: " in errors


# -- the groups catch what the engine raises ------------------------------------------------


@workflow(name="waits")
class Waits:
    async def run(self, ctx: WorkflowCtx, input: int) -> str:
        try:
            await ctx.wait_for_signal("go", timeout=5)
        except flowkit.SignalTimeoutError as exc:  # the alias catches the timeout in a body
            return f"timed out after {exc.timeout:g} s"
        await ctx.wait_for_signal("never")
        return "signalled"


async def test_catching_by_group_around_engine_calls() -> None:
    async with TestEnv([Waits()]) as env:
        eng = env.engines[0]
        with pytest.raises(flowkit.CallRefusedError) as refused:
            await eng.start("waits", "not a number", "r-bad")
        assert isinstance(refused.value, flowkit.InvalidInputError)
        with pytest.raises(flowkit.NotFoundError) as missing:
            await eng.start("nope", 1, "r-nope")
        assert isinstance(missing.value, flowkit.WorkflowNotFoundError)
        with pytest.raises(flowkit.NotFoundError):
            await eng.signal("ghost", "go", 1)
        assert await eng.list_runs() == []

        await env.start("waits", 1, "r-timeout")
        await env.advance(5)
        assert await env.result("r-timeout") == "timed out after 5 s"

        await env.start("waits", 1, "r-cancel")
        await env.signal("r-cancel", "go", None)
        await env.cancel("r-cancel")
        with pytest.raises(flowkit.RunNotCompletedError) as outcome:
            await eng.result("r-cancel", timeout=1)
        assert isinstance(outcome.value, flowkit.RunCancelledError)
        assert outcome.value.run_id == "r-cancel"
        with pytest.raises(flowkit.CallRefusedError) as state:
            await eng.signal("r-cancel", "go", None)
        assert isinstance(state.value, flowkit.RunStateError)
