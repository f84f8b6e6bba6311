"""The replay core: one activation of a workflow body over its history, and ``replay``.

Modules, one job each (from the bottom up):

* ``signals``: the internal control-flow exceptions that unwind a body;
* ``branch``: the body's lines of execution, with their positions, clock, RNG, guard state;
* ``matching``: whether a recorded event answers a ctx call (one function per event kind);
* ``outcome``: how an activation ends (``Completed``, ``Suspended``, ...);
* ``patches``: ``ctx.patched``/``deprecate_patch``: whether the run was recorded past a patch
  point, its markers, and what they say in a divergence report;
* ``state``: ``ActivationState``, what one activation knows and records;
* ``guard``: what a body may await (only ctx calls), checked as it runs;
* ``steps``: the step call (memoized outcome, retries with durable backoff, cancellation);
* ``waits``: the durable waits (timers, signals with their timeouts);
* ``calls``: ``Calls``, the ctx calls as ``WorkflowCtx`` makes them, and ``ctx.gather``;
* ``activation``: ``Activation``, which runs a body, tears it down and reports its outcome;
* ``replayer``: ``flowkit.replay`` and ``replay_dir``, side-effect-free replays.
"""

from .activation import Activation
from .matching import ReplayStub
from .outcome import (
    Cancelled,
    Completed,
    Continued,
    Diverged,
    Evicted,
    Failed,
    Outcome,
    Suspended,
    error_info,
)
from .state import Host

__all__ = [
    "Activation",
    "Cancelled",
    "Completed",
    "Continued",
    "Diverged",
    "Evicted",
    "Failed",
    "Host",
    "Outcome",
    "ReplayStub",
    "Suspended",
    "error_info",
]
