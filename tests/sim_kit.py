"""What the seeded crash-plan tests share: starting a run on whichever instance is alive."""

from __future__ import annotations

from typing import Any

from flowkit import Run
from flowkit_testing import InstanceCrashed, TestEnv


async def start_on_a_live_instance(env: TestEnv, workflow: str, input: Any, run_id: str) -> Run:
    """Start ``run_id`` on the first live instance; one that dies while serving the start
    (a crash plan) is passed over for the next, and instance 0 restarted when none is left."""
    while True:
        live = [j for j in range(len(env.engines)) if j not in env.crashed]
        if not live:
            await env.restart(0)
            continue
        try:
            return await env.engines[live[0]].start(workflow, input, run_id)
        except InstanceCrashed:
            continue
