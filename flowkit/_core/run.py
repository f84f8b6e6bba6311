"""The run model: ``RunStatus``, the ``Run`` snapshot stores hand out, and ``InboxSignal``, a
signal waiting in a run's inbox."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .limits import MAX_RUN_ID_LENGTH


class RunStatus(enum.StrEnum):
    """Lifecycle of a run. ``completed``, ``failed``, ``cancelled`` and ``dead`` are terminal
    (``dead``: its activation was lost more than ``max_recovery_attempts`` times)."""

    PENDING = "pending"
    RUNNING = "running"
    SUSPENDED = "suspended"
    BLOCKED = "blocked"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DEAD = "dead"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def active(self) -> bool:
        return self not in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset(
    {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.DEAD}
)
ACTIVE_STATUSES = frozenset(RunStatus) - TERMINAL_STATUSES

SINGLETON_TAG_PREFIX = "singleton:"
ADMITTED_TAG = "flowkit:singleton:admitted"
RESERVED_TAG_PREFIX = "flowkit:"
# The longest run id and singleton key (in characters) every store keeps: PostgreSQL's
# columns are VARCHAR(255). All the limits: ``flowkit._core.limits`` (``flowkit.stores.limits``).
MAX_ID_LENGTH = MAX_RUN_ID_LENGTH


def run_tags(tags: Iterable[str], key: str | None) -> list[str]:
    """A new run's tags: the caller's, once each and without reserved ones, the singleton tag
    of ``key`` first (``start``, a child's start, a continuation's successor)."""
    clean = [
        t
        for t in dict.fromkeys(tags)
        if not t.startswith(RESERVED_TAG_PREFIX) and not t.startswith(SINGLETON_TAG_PREFIX)
    ]
    if key is not None:
        clean.insert(0, SINGLETON_TAG_PREFIX + key)
    return clean


@dataclass(frozen=True)
class Run:
    """A snapshot of one run. Timestamps are float seconds since the Unix epoch.

    Beyond the public fields, stores keep execution bookkeeping here (lease, wake reasons)."""

    id: str
    workflow: str
    workflow_version: str
    status: RunStatus
    input: Any
    output: Any = None
    error: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()
    created_at: float = 0.0
    updated_at: float = 0.0
    wake_at: float | None = None
    namespace: str | None = None
    singleton_key: str | None = None
    attempt: int = 1
    lease_owner: str | None = None
    lease_expires: float | None = None
    waiting_signals: tuple[str, ...] = field(default=())
    # the instant its ``execution_timeout`` cancels it (durable: set at start, kept across
    # crashes and retries), or None
    deadline_at: float | None = None
    # activations lost so far (claims of its expired lease); ``max_recovery_attempts`` bounds it
    recoveries: int = 0
    # the run whose ctx.child / ctx.start_child started it (None: started by an engine)
    parent_id: str | None = None
    # ``ctx.continue_as_new``: the successor this (completed) run continued as
    continued_as: str | None = None
    # search attributes (docs/search-and-retention.md): set at start, merged by
    # ``ctx.upsert_search``; values str, int, float or bool (kept out of the hash: a dict is not
    # hashable)
    search: dict[str, str | int | float | bool] = field(default_factory=dict, hash=False)

    @property
    def singleton_tag(self) -> str | None:
        return None if self.singleton_key is None else SINGLETON_TAG_PREFIX + self.singleton_key

    @property
    def admitted(self) -> bool:
        """Whether the run holds a singleton slot (carries the admission marker)."""
        return ADMITTED_TAG in self.tags

    def leased(self, now: float) -> bool:
        """Whether some instance holds a live execution lease."""
        return (
            self.lease_owner is not None
            and self.lease_expires is not None
            and self.lease_expires > now
        )


@dataclass(frozen=True)
class InboxSignal:
    """A signal in a run's inbox (``Store.peek_signal``): its inbox id, name and payload."""

    id: int
    name: str
    payload: Any
