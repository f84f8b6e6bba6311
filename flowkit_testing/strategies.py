"""Hypothesis strategies over harness seeds and fault plans.

A failing example shrinks towards seed 0 and no faults, and Hypothesis prints the seed and plan
that reproduce it: pass them to ``TestEnv(seed=..., faults=...)`` to replay the same
interleaving, faults and histories. Import on demand (Hypothesis is a test dependency)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import strategies as st

from ._faults import WRITE_OPS, FaultPlan

__all__ = ["fault_plans", "harness_randoms", "seeds"]


def seeds() -> st.SearchStrategy[int]:
    """Harness seeds: each one is a distinct, reproducible interleaving."""
    return st.integers(min_value=0, max_value=2**32 - 1)


def fault_plans(max_rate: float = 0.1) -> st.SearchStrategy[FaultPlan | None]:
    """``None`` (no faults) or a ``FaultPlan`` over a subset of the write operations."""
    plan = st.builds(
        FaultPlan,
        rate=st.floats(min_value=0.0, max_value=max_rate, allow_nan=False),
        ops=st.lists(st.sampled_from(WRITE_OPS), min_size=1, unique=True).map(tuple),
        phases=st.sampled_from([("before",), ("after",), ("before", "after")]),
        crash_rate=st.sampled_from([0.0, 0.0, 0.02, 0.05]),
    )
    return st.one_of(st.none(), plan)


def harness_randoms() -> st.SearchStrategy[random.Random]:
    """A ``random.Random`` whose seed Hypothesis chooses (and shrinks, and prints)."""
    return st.randoms(use_true_random=False)


def describe(seed: int, plan: Any) -> str:
    """The one line that reproduces an example: paste it into a test."""
    return f"TestEnv(seed={seed}, faults={plan!r})"
