"""A model (no database) of flowkit's throughput against the number of database nodes: several
PostgreSQL databases partitioned by namespace, against one distributed SQL cluster.

Pure arithmetic, deterministic, built from the single-node figures of docs/performance.md (the
``PARAMS`` below quote which); docs/scaling.md prints its table and spells out the model.
Run: ``python bench/scaling_model.py [--smoke]`` (also part of ``bench/run.py``; ``--smoke``
prints the same table, the model being instant)."""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Params:
    """The model's inputs. Those read from docs/performance.md say so; the rest are stated
    assumptions (docs/scaling.md, "The model")."""

    commit_ms: float = 0.25
    """One durable single-row commit on one PostgreSQL (performance.md, "The machine": "a
    commit waits for its WAL flush, 0.25 ms here"): the raw limit is 1 / commit_ms."""
    group_commit_ratio: float = 2.59
    """Durable steps/s ÷ raw commits/s, 40-step workflows, 32 in flight, PostgreSQL
    (performance.md, "Latest figures": 2.59x): one node's step capacity at saturation."""
    in_flight_per_node: int = 32
    """Runs in flight per node's worth of workers: the 32 of the figure above."""
    handover_ms: float = 2.1
    """A singleton hand-over, release → the next run's first step, mean, PostgreSQL in one
    process (performance.md, "Latest figures", the 10 keys x 20 runs row: 2.1 / 3.8 ms)."""
    handover_commits: int = 1
    """Commits in a row inside that hand-over: the release, which hands the slot off in the
    same statement (the next run's engine is the releasing one, so no claim commit)."""
    work_ms: float = 0.0
    """The hot key's holder's own time between admission and release (0: the ceiling)."""
    replication_factor: int = 3
    """Distributed SQL: copies of every write (the engines' usual default; an assumption)."""
    engine_cpu_factor: float = 1.0
    """Distributed SQL: CPU and disk of one replica's write ÷ PostgreSQL's commit (1.0 is
    generous to the distributed engine; an assumption, not measured)."""
    namespaces: int = 64
    """Namespaces the load is spread over (partitioning moves whole namespaces)."""
    zipf_s: float = 1.0
    """Skew of the load over namespaces: weight of the i-th namespace ∝ 1 / i**zipf_s."""

    @property
    def raw_commits(self) -> float:
        """The raw limit of one node, commits/s."""
        return 1000.0 / self.commit_ms

    @property
    def node_steps(self) -> float:
        """One node's durable steps/s (one commit each) with 32 in flight."""
        return self.group_commit_ratio * self.raw_commits


PARAMS = Params()
NODES = (1, 2, 3, 4, 8, 16, 32)
RTTS_MS = (0.5, 4.0, 20.0)
"""Round trips between nodes: 0.5 ms (one zone; an assumption), 4 ms (the latency bench's link
of performance.md, "2 ms added each way") and 20 ms (regions apart; an assumption)."""


def weights(p: Params, skew: bool) -> list[float]:
    """Each namespace's share of the load, largest first (sum 1)."""
    raw = [1.0 / (i**p.zipf_s) if skew else 1.0 for i in range(1, p.namespaces + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def busiest_share(shares: list[float], nodes: int) -> float:
    """The largest load on one node when whole namespaces are placed on ``nodes`` databases,
    largest first onto the least loaded (LPT), or on fewer nodes when that is lighter (a user
    can leave a database empty, so adding one never makes the placement worse)."""
    best = math.inf
    for n in range(1, nodes + 1):
        load = [0.0] * n
        for w in shares:  # (largest first: ``weights`` is sorted)
            i = min(range(n), key=lambda k: (load[k], k))
            load[i] += w
        best = min(best, max(load))
    return best


def partitioned(p: Params, nodes: int, skew: bool) -> float:
    """Steps/s of ``nodes`` independent PostgreSQL databases, whole namespaces on each: the
    busiest database saturates first, and the others carry load in proportion."""
    return p.node_steps / busiest_share(weights(p, skew), nodes)


def cross_share(nodes: int) -> float:
    """The share of commits whose rows (a run row and its events, two tables, two ranges or
    shards) have leaders on two nodes: 1 - 1/nodes, placement being uniform."""
    return 1.0 - 1.0 / nodes


def dist_commit_ms(p: Params, nodes: int, rtt_ms: float) -> float:
    """One commit's added latency on a distributed engine: a consensus round trip to a quorum
    once there is a replica elsewhere, and a second round (two-phase) when the rows' leaders
    are on two nodes."""
    replicas = min(p.replication_factor, nodes)
    return (rtt_ms if replicas > 1 else 0.0) + cross_share(nodes) * rtt_ms


def distributed(p: Params, nodes: int, rtt_ms: float) -> float:
    """Steps/s of one distributed SQL cluster of ``nodes``: the lesser of its capacity (every
    commit written on min(RF, nodes) replicas, and a cross-node one twice) and what the runs in
    flight can issue (Little's law: each commit waits the single node's latency plus the
    distributed engine's round trips)."""
    replicas = min(p.replication_factor, nodes)
    cost = replicas * (1.0 + cross_share(nodes)) * p.engine_cpu_factor
    capacity = nodes * p.node_steps / cost
    latency_s = p.in_flight_per_node / p.node_steps + dist_commit_ms(p, nodes, rtt_ms) / 1000
    return min(capacity, nodes * p.in_flight_per_node / latency_s)


def hot_key(p: Params, nodes: int, rtt_ms: float | None) -> float:
    """Runs/s through one singleton key of limit 1: its runs follow one another, each after a
    hand-over (whose commits serialize on the key's advisory lock). Partitioned (``rtt_ms``
    None), the key lives in one database whatever the number of nodes; on a distributed
    engine every commit of the hand-over adds that engine's round trips."""
    extra = 0.0 if rtt_ms is None else p.handover_commits * dist_commit_ms(p, nodes, rtt_ms)
    return 1000.0 / (p.work_ms + p.handover_ms + extra)


def table(p: Params = PARAMS, nodes: tuple[int, ...] = NODES) -> list[tuple[str, list[float]]]:
    """Rows of the model: a label and a figure per node count."""
    rows: list[tuple[str, list[float]]] = [
        ("partitioned, even namespaces (steps/s)", [partitioned(p, n, False) for n in nodes]),
        ("partitioned, Zipf namespaces (steps/s)", [partitioned(p, n, True) for n in nodes]),
    ]
    for rtt in RTTS_MS:
        rows.append(
            (f"distributed, RTT {rtt:g} ms (steps/s)", [distributed(p, n, rtt) for n in nodes])
        )
    rows.append(("hot key, partitioned (runs/s)", [hot_key(p, n, None) for n in nodes]))
    for rtt in RTTS_MS:
        rows.append(
            (f"hot key, distributed, RTT {rtt:g} ms (runs/s)", [hot_key(p, n, rtt) for n in nodes])
        )
    return rows


def render(p: Params = PARAMS, nodes: tuple[int, ...] = NODES) -> str:
    """The table as Markdown (docs/scaling.md has it verbatim)."""
    head = "| model | " + " | ".join(f"{n} node{'s' if n > 1 else ''}" for n in nodes) + " |"
    rule = "|---|" + "---:|" * len(nodes)
    body = [
        f"| {label} | " + " | ".join(f"{v:,.0f}" for v in vals) + " |"
        for label, vals in table(p, nodes)
    ]
    return "\n".join([head, rule, *body])


async def main(smoke: bool = False) -> dict[str, Any]:
    """Print the table and return it (``bench/run.py``'s entry). The model takes no time, so
    ``smoke`` changes nothing but is accepted like every bench's."""
    del smoke
    p = PARAMS
    print(
        f"\nscaling model: one node = {p.raw_commits:,.0f} raw commits/s x {p.group_commit_ratio}"
    )
    print(render(p))
    return {
        "nodes": list(NODES),
        "rows": {label: vals for label, vals in table(p)},
        "params": {k: getattr(p, k) for k in p.__dataclass_fields__},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--smoke", action="store_true", help="the same table (the model is instant)"
    )
    asyncio.run(main(parser.parse_args().smoke))
