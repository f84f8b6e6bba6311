"""flowkit_testing: a virtual clock, multi-instance test environments and test kits."""

from ._clock import DEFAULT_START, VirtualClock
from ._env import InstanceCrashed, TestEnv

__all__ = ["DEFAULT_START", "InstanceCrashed", "TestEnv", "VirtualClock"]
