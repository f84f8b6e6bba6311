"""What ``Engine.result`` tells: the outcome of a settled run (its output or the error it
raises), and why an unsettled one may not be moving (the message of ``ResultTimeoutError``)."""

from __future__ import annotations

from typing import Any

from .._core.run import Run, RunStatus
from .._model.definition import WorkflowDefinition
from .._worker.worker import WORKER_SEEN_WINDOW, no_live_worker
from ..errors import RunCancelledError, StepFailedError, WorkflowFailedError
from ..stores.base import Store


def outcome(defn: WorkflowDefinition | None, run: Run) -> Any:
    """What ``Engine.result`` gives for a settled run: its output (validated with the output
    type of ``defn``, the run's own version, when registered), or the error it raises."""
    if run.status is RunStatus.COMPLETED:
        if defn is None:
            return run.output
        return defn.output_adapter.validate_python(run.output)
    if run.status is RunStatus.CANCELLED:
        raise RunCancelledError(run.id)
    # (a dead run raises WorkflowFailedError too: its error's type is "RunDead")
    err = run.error or {"type": "Error", "message": "unknown failure"}
    cause: BaseException | None = None
    if err.get("step"):
        cause = StepFailedError(
            err["step"],
            err.get("cause_type") or err.get("type", "Error"),
            err.get("cause_message") or err.get("message", ""),
            err.get("attempts") or 1,
        )
    raise WorkflowFailedError(run.id, err, cause)


async def version_missing(store: Store, run: Run, now: float) -> str | None:
    """What to say when no worker with the run's ``(workflow, version)`` has been seen
    within ``WORKER_SEEN_WINDOW`` (a store that ``records_workers``), else ``None``."""
    if not run.status.active:
        return None
    try:
        missing = await no_live_worker(store, [run], now)
    except Exception:  # (best effort: the hint goes without it)
        return None
    if not missing or run.id not in missing:
        return None
    return (
        f"no worker with workflow {run.workflow!r} version {run.workflow_version!r} has "
        f"been seen in the last {WORKER_SEEN_WINDOW:.0f} s: it waits for one (deploy "
        "that version, or keep a worker that has it running)"
    )


def stall_hint(run: Run, now: float, is_worker: bool, worker_running: bool) -> str:
    """Why an unsettled run may not be moving, from its snapshot and what the asking engine
    is (``is_worker``: not a client; ``worker_running``: its worker runs now)."""
    here = "this engine's worker is not running (use `async with engine:` or " + (
        "`await engine.start_worker()`)" if is_worker else "it was made with worker=False)"
    )
    if run.lease_owner is not None and run.lease_expires is not None:
        if run.lease_expires <= now:
            return (
                f"its lease (worker {run.lease_owner!r}) expired "
                f"{now - run.lease_expires:.1f} s ago: that worker probably died; any "
                "worker recovers the run at its next poll"
            )
        return (
            f"worker {run.lease_owner!r} holds its lease for {run.lease_expires - now:.1f} s "
            "more; if that worker died, any worker recovers the run once the lease expires"
        )
    if run.status in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.CANCELLING):
        who = here if not worker_running else "this engine's worker has not claimed it"
        return (
            f"no worker has claimed it: {who}, and no other worker on this store "
            f"(namespace {run.namespace!r}) with workflow {run.workflow!r} took it"
        )
    if run.status is RunStatus.BLOCKED:
        msg = (run.error or {}).get("message", "")
        return f"it is blocked until its code replays its history: {msg}"
    parts = []
    if run.singleton_key is not None and not run.admitted:
        parts.append(f"it waits for a slot of singleton key {run.singleton_key!r}")
    if run.waiting_signals:
        parts.append(f"it waits for signal(s) {', '.join(run.waiting_signals)}")
    if run.wake_at is not None:
        parts.append(f"it wakes in {run.wake_at - now:.1f} s")
    if not worker_running:
        parts.append(here)
    return "; ".join(parts) or "it is waiting"


__all__ = ["outcome", "stall_hint", "version_missing"]
