"""``replay(history, workflow)``: re-run a body against a recorded history, side-effect free.

``replay_dir(path, workflows)`` replays a directory of recorded histories (JSON files written by
``History.to_json()``) and returns a ``ReplayReport``: the regression test of workflow code
changes against "golden" histories."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._core.run import InboxSignal, Run
from .._model.definition import definition_of
from .._model.history import History
from .._model.registry import natural_key
from ..errors import (
    FlowkitError,
    HistoryError,
    NonDeterminismError,
    ReplayError,
    VersionMismatchError,
    WorkflowNotFoundError,
)
from ..events import (
    Event,
    PatchMarker,
    RunCompleted,
    RunContinued,
    RunFailed,
    RunRetried,
    RunStarted,
)
from .activation import Activation
from .children import ChildCall, ChildStart
from .matching import ReplayStub
from .outcome import Completed, Continued, Diverged, Evicted, Failed, Suspended
from .state import with_note

if TYPE_CHECKING:
    from .._core.event_keys import TakenEvent


class _ReplayHost:
    """The host of a replay-only activation: the clock stands at the history's last event;
    nothing is ever recorded, and no signal is waiting."""

    def __init__(self, at: float) -> None:
        self._at = at

    def now(self) -> float:
        return self._at

    async def record(
        self,
        events: Sequence[Event],
        consume_signal: int | None = None,
        search: dict[str, Any] | None = None,
    ) -> bool:
        raise AssertionError("replay-only activations never record")  # pragma: no cover

    async def peek_signal(self, name: str) -> InboxSignal | None:
        return None

    async def take_event(
        self, pos: str, name: str, match: dict[str, str], *, wait: bool
    ) -> TakenEvent | None:
        return None

    async def drop_event_wait(self, pos: str, name: str) -> None:
        return None

    def lease_live(self) -> bool:
        return True  # (nothing runs: a replay-only activation stops before any step)

    async def compensating(self, events: Sequence[Event]) -> None:
        raise AssertionError("replay-only activations never record")  # pragma: no cover

    async def cancel_compensates(self) -> bool:
        return False  # (the history holds the request: the activation read it there)

    # (a replay-only activation stops before any step runs: no timeout, no step thread)
    async def sleep_until(self, deadline: float) -> None:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    def add_timer(self, token: object, at: float) -> None:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    def drop_timer(self, token: object) -> None:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    def step_began(self) -> object:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    def step_ended(self, token: object) -> None:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    def in_thread(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        raise AssertionError("replay-only activations run no step")  # pragma: no cover

    # (a replay-only activation stops before it would start or read a child)
    async def start_child(self, parent_id: str, call: ChildCall) -> ChildStart:
        raise AssertionError("replay-only activations start no child")  # pragma: no cover

    async def child_run(self, run_id: str) -> Run | None:
        raise AssertionError("replay-only activations read no child")  # pragma: no cover


async def replay_async(history: History, workflow: Any) -> None:
    """Async form of ``replay``."""
    defn = definition_of(workflow)
    if defn is None:
        raise WorkflowNotFoundError(getattr(workflow, "__name__", repr(workflow)))
    first = history.events[0] if history.events else None
    if not isinstance(first, RunStarted):
        raise HistoryError("history must start with run_started")
    if first.workflow != defn.name:
        raise HistoryError(f"history is of workflow {first.workflow!r}, not {defn.name!r}")
    if first.version != defn.version:  # (never a divergence: no worker would replay it so)
        raise VersionMismatchError(defn.name, first.version, (defn.version,))
    instance = workflow if not isinstance(workflow, type) else _bare_instance(workflow)
    last = history.events[-1]
    act = Activation(
        defn,
        instance,
        history.run_id,
        defn.input_adapter.validate_python(latest_input(history.events)),
        history.events,
        _ReplayHost(last.at),
        # (the cancellation's request: the activation reads it from the history, as a worker's
        # does, and so replays the deliveries the run went through)
        attempt=1 + sum(isinstance(e, RunRetried) for e in history.events),
        replay_only=True,
    )
    outcome = await act.run()
    terminal = last if isinstance(last, RunCompleted | RunFailed) else None
    note = act.patch_note
    continued = next((e for e in history.events if isinstance(e, RunContinued)), None)
    if terminal is not None:
        _check_continuation(outcome, continued, terminal, note())
    match outcome:
        case Diverged(err):
            raise err
        case Continued(_):
            pass  # (checked above)
        case Completed(output):
            if isinstance(terminal, RunCompleted) and terminal.output != output:
                raise NonDeterminismError(
                    "end",
                    f"run_completed#{terminal.seq}",
                    "a different output",
                    with_note(
                        f"recorded {terminal.output!r:.80}, replay returned {output!r:.80}", note()
                    ),
                )
            if isinstance(terminal, RunFailed):
                raise NonDeterminismError("end", f"run_failed#{terminal.seq}", "completion", note())
        case Failed(error):
            if isinstance(terminal, RunCompleted):
                raise NonDeterminismError(
                    "end",
                    f"run_completed#{terminal.seq}",
                    f"failure {error.type}: {error.message}",
                    note(),
                )
        case Evicted() | Suspended(_, _):
            if terminal is not None and act.replay_stopped_at is not None:
                raise NonDeterminismError(
                    act.replay_stopped_at.rsplit(" ", 1)[-1],
                    f"{terminal.type}#{terminal.seq} (the end)",
                    act.replay_stopped_at,
                    note(),
                )
        case _:
            pass


def _check_continuation(
    outcome: object, continued: RunContinued | None, terminal: Event, note: str
) -> None:
    """A history that settled by ``ctx.continue_as_new`` replays only to a body that
    continues again with the same input, and a body that continues only to such a history:
    the end of the body is compared as its output is (``run_continued`` answers no call)."""
    if isinstance(outcome, Continued):
        if continued is None:
            raise NonDeterminismError(
                "end", f"{terminal.type}#{terminal.seq}", "ctx.continue_as_new()", note
            )
        if continued.input != outcome.input:
            raise NonDeterminismError(
                "end",
                f"run_continued#{continued.seq}",
                "ctx.continue_as_new() with a different input",
                with_note(
                    f"recorded {continued.input!r:.80}, replay gave {outcome.input!r:.80}", note
                ),
            )
    elif continued is not None and isinstance(outcome, Completed | Failed):
        what = "completion" if isinstance(outcome, Completed) else "failure"
        raise NonDeterminismError(
            "end", f"run_continued#{continued.seq}", f"{what} without continue-as-new", note
        )


def patches_taken(history: Sequence[Event]) -> tuple[str, ...]:
    """The ids of the patches ``history`` took (its ``patch_marker`` events), in order."""
    return tuple(dict.fromkeys(e.patch_id for e in history if isinstance(e, PatchMarker)))


def latest_input(events: Sequence[Event]) -> Any:
    """The input the run's body got last: ``run_started``'s, or the input of the latest
    ``run_retried`` that carried one (``engine.retry(run_id, input=...)``)."""
    for ev in reversed(events):
        if isinstance(ev, RunRetried) and ev.new_input:
            return ev.input
    first = events[0] if events else None
    return first.input if isinstance(first, RunStarted) else None


def _bare_instance(cls: type) -> Any:
    """``cls()`` when it needs no arguments; else an instance whose missing attributes (the
    services its constructor would inject) are ``ReplayStub``s: replay never runs steps."""
    try:
        return cls()
    except TypeError:
        pass

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return ReplayStub(name)

    stubbed = type(cls.__name__, (cls,), {"__getattr__": __getattr__})
    return object.__new__(stubbed)


def replay(history: History | str, workflow: Any) -> None:
    """Re-run ``workflow``'s body against ``history``; raise ``NonDeterminismError`` at the
    first divergence. Steps are never executed. A history recorded on another version of the
    workflow than ``workflow``'s raises ``VersionMismatchError`` before anything replays.
    Call ``replay_async`` inside an event loop."""
    if isinstance(history, str):
        history = History.from_json(history)
    _no_running_loop("replay")
    asyncio.run(replay_async(history, workflow))


def _no_running_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"{what}() called inside an event loop: use `await {what}_async(...)`")


# -- many histories -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of replaying one history file.

    ``status`` is ``"ok"`` (the history replays), ``"diverged"`` (``error`` is the
    ``NonDeterminismError``) or ``"error"`` (the file could not be replayed at all: not a
    flowkit history, no workflow of its name was given, none of its version (a
    ``VersionMismatchError``), its input no longer validates...; ``error`` says why).
    ``version`` is the workflow version the history was recorded on."""

    path: Path
    status: Literal["ok", "diverged", "error"]
    run_id: str | None = None
    workflow: str | None = None
    events: int = 0
    error: Exception | None = None
    # the patches the history took (its ``patch_marker`` ids, in order)
    patches: tuple[str, ...] = ()
    version: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line (a divergence: its full report below it)."""
        what = self.path.name
        if self.run_id is not None:
            took = "".join(f", patch {p!r}" for p in self.patches)
            what += (
                f" (run {self.run_id!r}, workflow {self.workflow!r}, {self.events} events{took})"
            )
        if self.status == "ok":
            return f"ok        {what}"
        if isinstance(self.error, NonDeterminismError):
            body = "\n".join("    " + line for line in self.error.report().splitlines())
            return f"diverged  {what}\n{body}"
        return f"error     {what}: {_one_line(self.error)}"


@dataclass(frozen=True)
class ReplayReport:
    """What ``replay_dir`` found: one ``ReplayResult`` per file, in file-name order."""

    directory: Path
    results: tuple[ReplayResult, ...]

    @property
    def diverged(self) -> list[ReplayResult]:
        return [r for r in self.results if r.status == "diverged"]

    @property
    def errors(self) -> list[ReplayResult]:
        return [r for r in self.results if r.status == "error"]

    @property
    def failures(self) -> list[ReplayResult]:
        """Divergences and errors, in file order."""
        return [r for r in self.results if r.status != "ok"]

    @property
    def passed(self) -> bool:
        """No divergence and no error (an empty directory passes: see ``raise_for_failures``)."""
        return not self.failures

    def summary(self) -> str:
        """A headline, then one line per failure (a divergence with its report)."""
        lines = [
            f"{len(self.results)} histories in {self.directory}: "
            f"{sum(r.ok for r in self.results)} ok, {len(self.diverged)} diverged, "
            f"{len(self.errors)} error{'' if len(self.errors) == 1 else 's'}"
        ]
        lines.extend(r.describe() for r in self.failures)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def raise_for_failures(self, *, allow_empty: bool = False) -> None:
        """Raise ``ReplayFailedError`` listing every divergence and error; also when the
        directory held no history at all, unless ``allow_empty`` (a mistyped path or a lost
        directory must not pass a regression test silently)."""
        __tracebackhide__ = True  # pytest: show the caller's line, not this one
        if self.failures or (not self.results and not allow_empty):
            raise ReplayFailedError(self)


class ReplayFailedError(ReplayError, AssertionError):
    """Raised by ``ReplayReport.raise_for_failures``: some recorded histories no longer replay
    against the current code (or could not be replayed). ``report`` is the ``ReplayReport``;
    the message lists every failure. It is an ``AssertionError``, so test runners show it as a
    failed check."""

    def __init__(self, report: ReplayReport) -> None:
        self.report = report
        if not report.results:
            msg = f"no histories to replay in {report.directory}"
        else:
            msg = "recorded histories no longer replay\n" + report.summary()
        super().__init__(msg)


def _one_line(exc: BaseException | None) -> str:
    if exc is None:  # pragma: no cover - results with status "error" always carry one
        return "unknown error"
    text = " ".join(str(exc).split())
    if isinstance(exc, FlowkitError):
        return text
    return f"{type(exc).__name__}: {text}"


def _by_name(workflows: Any) -> dict[str, dict[str, Any]]:
    """``workflows`` by name, then by version: several versions of one workflow may be given
    (each history replays against its own), one ``(name, version)`` only once."""
    if definition_of(workflows) is not None:  # one class or instance
        workflows = [workflows]
    if isinstance(workflows, str | bytes) or not isinstance(workflows, Iterable):
        raise TypeError("workflows must be a sequence of @workflow classes or instances")
    named: dict[str, dict[str, Any]] = {}
    for wf in workflows:
        defn = definition_of(wf)
        if defn is None:
            raise TypeError(f"{wf!r} is not a @workflow class or instance")
        versions = named.setdefault(defn.name, {})
        if defn.version in versions:
            raise ValueError(
                f"two workflows named {defn.name!r} of version {defn.version!r} given to replay_dir"
            )
        versions[defn.version] = wf
    return named


def pick_version(history: History, versions: dict[str, Any]) -> Any:
    """The workflow of ``versions`` (one workflow's, by version) that ``history`` was recorded
    on; ``VersionMismatchError`` naming the versions there are when none was."""
    first = history.events[0] if history.events else None
    if not isinstance(first, RunStarted):  # (not a run's history: ``replay`` says so)
        return next(iter(versions.values()))
    if first.version in versions:
        return versions[first.version]
    available = tuple(sorted(versions, key=natural_key))
    raise VersionMismatchError(first.workflow, first.version, available)


def _history_files(directory: Path, pattern: str) -> list[Path]:
    if not directory.is_dir():
        raise NotADirectoryError(f"no directory of histories at {directory}")
    return sorted(p for p in directory.glob(pattern) if p.is_file())


def _load(path: Path) -> History | Exception:
    try:
        return History.from_json(path.read_bytes())
    except (OSError, HistoryError) as exc:
        return exc


async def _replay_file(path: Path, named: dict[str, dict[str, Any]]) -> ReplayResult:
    history = _load(path)
    if isinstance(history, Exception):
        return ReplayResult(path, "error", error=history)
    first = history.events[0] if history.events else None
    info: dict[str, Any] = {
        "run_id": history.run_id,
        "workflow": history.workflow,
        "events": len(history),
        "patches": patches_taken(history),
        "version": first.version if isinstance(first, RunStarted) else None,
    }
    versions = named.get(history.workflow or "")
    if versions is None:
        known = ", ".join(repr(n) for n in sorted(named)) or "none"
        err = WorkflowNotFoundError(str(history.workflow))
        err.args = (f"no workflow named {history.workflow!r} was given (given: {known})",)
        return ReplayResult(path, "error", error=err, **info)
    try:
        await replay_async(history, pick_version(history, versions))
    except NonDeterminismError as exc:
        return ReplayResult(path, "diverged", error=exc, **info)
    except Exception as exc:  # e.g. the recorded input no longer validates
        return ReplayResult(path, "error", error=exc, **info)
    return ReplayResult(path, "ok", **info)


async def replay_dir_async(
    path: str | Path, workflows: Any, *, pattern: str = "*.json"
) -> ReplayReport:
    """Async form of ``replay_dir``."""
    directory = Path(path)
    named = _by_name(workflows)
    files = _history_files(directory, pattern)
    results = [await _replay_file(f, named) for f in files]
    return ReplayReport(directory, tuple(results))


def replay_dir(path: str | Path, workflows: Any, *, pattern: str = "*.json") -> ReplayReport:
    """Replay every history file in ``path`` (``pattern``, default ``*.json``; ``"**/*.json"``
    descends into subdirectories) against the workflow of ``workflows`` (a sequence of
    ``@workflow`` classes or instances, or just one) whose name and version are the history's
    ``run_started.workflow`` and ``.version`` (give every version whose runs you recorded; a
    history of a version not given is an ``error`` result, a ``VersionMismatchError``). Never
    raises for a bad file: each file gets a ``ReplayResult`` (``ok``, ``diverged`` with its
    ``NonDeterminismError``, or ``error``), and ``report.raise_for_failures()`` turns failures
    into one ``ReplayFailedError``. Call ``replay_dir_async`` inside an event loop."""
    _no_running_loop("replay_dir")
    return asyncio.run(replay_dir_async(path, workflows, pattern=pattern))
