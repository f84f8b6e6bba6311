"""The invariants of bench/scaling_model.py (docs/scaling.md's table), not its numbers: the
model must keep the shape the page reasons from whatever its parameters."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

NODES = (1, 2, 3, 4, 5, 8, 13, 16, 32, 64)


def _load() -> ModuleType:
    path = Path(__file__).parent.parent / "bench" / "scaling_model.py"
    spec = importlib.util.spec_from_file_location("scaling_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scaling_model"] = module  # (dataclasses resolve their module by name)
    spec.loader.exec_module(module)
    return module


sm = _load()

PARAMS = [
    sm.PARAMS,
    sm.Params(namespaces=7, zipf_s=2.0),
    sm.Params(namespaces=200, zipf_s=0.5, commit_ms=1.0, group_commit_ratio=1.3),
    sm.Params(replication_factor=5, engine_cpu_factor=2.0, handover_ms=6.3, work_ms=10.0),
]


@pytest.mark.parametrize("p", PARAMS)
@pytest.mark.parametrize("skew", [False, True])
def test_partitioned_is_monotone_and_bounded(p: object, skew: bool) -> None:
    figures = [sm.partitioned(p, n, skew) for n in NODES]
    assert figures == sorted(figures), "adding a database never lowers throughput"
    single = sm.partitioned(p, 1, skew)
    assert single == pytest.approx(p.node_steps)  # type: ignore[attr-defined]
    for n, f in zip(NODES, figures, strict=True):
        assert f <= n * single * (1 + 1e-9)


@pytest.mark.parametrize("p", PARAMS)
def test_even_namespaces_scale_linearly_when_they_divide(p: object) -> None:
    n = p.namespaces  # type: ignore[attr-defined]
    assert sm.partitioned(p, n, False) == pytest.approx(n * sm.partitioned(p, 1, False))


@pytest.mark.parametrize("p", PARAMS)
def test_skewed_namespaces_stop_at_the_busiest_one(p: object) -> None:
    top = sm.weights(p, True)[0]
    ceiling = p.node_steps / top  # type: ignore[attr-defined]
    assert all(sm.partitioned(p, n, True) <= ceiling * (1 + 1e-9) for n in NODES)
    assert sm.partitioned(p, p.namespaces, True) == pytest.approx(ceiling)  # type: ignore[attr-defined]


@pytest.mark.parametrize("p", PARAMS)
@pytest.mark.parametrize("rtt", [0.5, 4.0, 20.0])
def test_distributed_is_bounded_and_pays_for_replication(p: object, rtt: float) -> None:
    for n in NODES:
        d = sm.distributed(p, n, rtt)
        assert 0 < d <= n * sm.partitioned(p, 1, False) * (1 + 1e-9)
        if n > 1:  # every write is replicated: below n independent databases
            assert d < n * sm.partitioned(p, 1, False)
    # past the replication factor, more nodes only add capacity
    big = [sm.distributed(p, n, rtt) for n in NODES if n >= p.replication_factor]  # type: ignore[attr-defined]
    assert big == sorted(big)
    # a longer round trip never helps
    assert sm.distributed(p, 8, rtt) >= sm.distributed(p, 8, rtt * 10)


@pytest.mark.parametrize("p", PARAMS)
@pytest.mark.parametrize("rtt", [None, 0.5, 4.0, 20.0])
def test_a_hot_key_does_not_grow_with_nodes(p: object, rtt: float | None) -> None:
    figures = [sm.hot_key(p, n, rtt) for n in NODES]
    assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(figures))
    assert figures[0] == pytest.approx(sm.hot_key(p, 1, None))
    if rtt is not None:
        assert figures[-1] < figures[0]  # round trips lengthen every hand-over


def test_the_table_is_deterministic_and_matches_its_rows() -> None:
    assert sm.render() == sm.render()
    rows = sm.table()
    assert {len(vals) for _, vals in rows} == {len(sm.NODES)}
    assert sm.render().count("\n") == len(rows) + 1
