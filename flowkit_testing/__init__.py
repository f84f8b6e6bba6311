"""flowkit_testing: a virtual clock, multi-instance test environments and test kits."""

from ._clock import DEFAULT_START, VirtualClock
from ._env import TestEnv
from ._faults import (
    CRASH_POINTS,
    CRASH_SITES,
    CrashSite,
    FaultPlan,
    InjectedFault,
    InstanceCrashed,
    Rule,
)

__all__ = [
    "CRASH_POINTS",
    "CRASH_SITES",
    "DEFAULT_START",
    "CrashSite",
    "FaultPlan",
    "InjectedFault",
    "InstanceCrashed",
    "Rule",
    "TestEnv",
    "VirtualClock",
]
