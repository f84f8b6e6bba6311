"""``flowkit.events``: the public event models, the one ``Event`` union and ``EVENT_TYPES`` read
off it, their JSON form; the old import paths; and the replay core importing no store."""

from __future__ import annotations

import ast
from pathlib import Path

import flowkit
import flowkit._model.history
import flowkit.events
from flowkit import History
from flowkit._core.run import InboxSignal
from flowkit.events import EVENT_TYPES, Event, event_from_json, event_to_json
from flowkit.stores import base

FLOWKIT = Path(flowkit.__file__).parent


def test_the_public_names() -> None:
    assert flowkit.events.__all__ == [
        "EVENT_TYPES",
        "CancelRequested",
        "ChildCompleted",
        "ChildFailed",
        "ChildStarted",
        "CompensationCompleted",
        "CompensationFailed",
        "ErrorInfo",
        "Event",
        "EventReceived",
        "EventSet",
        "PatchMarker",
        "RunCancelled",
        "RunCompleted",
        "RunContinued",
        "RunDead",
        "RunFailed",
        "RunRetried",
        "RunStarted",
        "SearchUpserted",
        "SignalReceived",
        "SingletonAdmitted",
        "SingletonGated",
        "SingletonReleased",
        "StepCompleted",
        "StepFailed",
        "TimerFired",
        "TimerStarted",
        "UpdateReceived",
        "UpdateReplied",
        "event_from_json",
        "event_to_json",
    ]
    assert flowkit.Event is Event


def test_the_type_names_are_fixed_and_read_off_the_union() -> None:
    assert EVENT_TYPES == (
        "run_started",
        "singleton_gated",
        "singleton_admitted",
        "step_completed",
        "step_failed",
        "timer_started",
        "timer_fired",
        "signal_received",
        "cancel_requested",
        "singleton_released",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "run_retried",
        "run_dead",
        "patch_marker",
        "child_started",
        "child_completed",
        "child_failed",
        "run_continued",
        "compensation_completed",
        "compensation_failed",
        "event_set",
        "event_received",
        "update_received",
        "update_replied",
        "search_upserted",
    )
    # every event model the module exports is a member of the union, once
    exported = [getattr(flowkit.events, n) for n in flowkit.events.__all__]
    models = [m for m in exported if isinstance(m, type) and "seq" in m.model_fields]
    assert sorted(m.model_fields["type"].default for m in models) == sorted(EVENT_TYPES)


def test_every_event_of_the_golden_histories_round_trips() -> None:
    for path in sorted((Path(__file__).parent / "histories").glob("*.json")):
        for ev in History.from_json(path.read_bytes()):
            assert event_from_json(event_to_json(ev)) == ev


def test_the_old_import_paths_still_work() -> None:
    for name in flowkit.events.__all__:
        assert getattr(flowkit._model.history, name) is getattr(flowkit.events, name)
    assert base.InboxSignal is InboxSignal


def _imports(path: Path) -> set[str]:
    """The modules ``path`` imports (relative ones resolved inside ``flowkit``)."""
    package = ".".join(path.relative_to(FLOWKIT.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            where = ".".join(base_parts) if node.level else ""
            module = ".".join(p for p in (where, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def _file_of(module: str) -> Path | None:
    """The source file of ``flowkit`` module ``module`` (``None``: not one)."""
    parts = module.split(".")
    if parts[0] != "flowkit":
        return None
    where = FLOWKIT.parent.joinpath(*parts)
    for path in (where.with_suffix(".py"), where / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_the_replay_core_and_the_events_import_no_store() -> None:
    """Layers point one way: the stores may import the events and the run model, never the
    other way round; nor anything the replay core imports, directly or not."""
    todo = [*sorted((FLOWKIT / "_replay").glob("*.py")), FLOWKIT / "events.py"]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen or path == FLOWKIT / "__init__.py":  # (the package: everything)
            continue
        seen.add(path)
        for module in _imports(path):
            assert "stores" not in module.split("."), f"{path.name} imports {module}"
            found = _file_of(module)
            if found is not None:
                todo.append(found)
    assert FLOWKIT / "_model/history.py" in seen and FLOWKIT / "_core/run.py" in seen
