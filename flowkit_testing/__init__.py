"""flowkit_testing: a virtual clock, multi-instance test environments and test kits."""

from ._clock import DEFAULT_START, VirtualClock
from ._env import TestEnv
from ._faults import CRASH_POINTS, FaultPlan, InjectedFault, InstanceCrashed, Rule

__all__ = [
    "CRASH_POINTS",
    "DEFAULT_START",
    "FaultPlan",
    "InjectedFault",
    "InstanceCrashed",
    "Rule",
    "TestEnv",
    "VirtualClock",
]
