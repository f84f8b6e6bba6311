"""pytest plugin (``pytest11`` entry point): the ``flowkit_env`` and ``flowkit_clock`` fixtures.

Mark a test ``@pytest.mark.flowkit(workflows=[...], instances=1, seed=0)`` or override the
``flowkit_workflows`` fixture to choose what the environment registers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from ._clock import VirtualClock
from ._env import TestEnv


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "flowkit(workflows=None, instances=1, seed=0): configure flowkit_env"
    )


@pytest.fixture
def flowkit_workflows() -> list[Any]:
    """Workflows registered in ``flowkit_env``; override in a conftest or use the marker."""
    return []


@pytest.fixture
def flowkit_clock() -> VirtualClock:
    """A fresh ``VirtualClock`` at the default start instant."""
    return VirtualClock()


try:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def flowkit_env(
        request: pytest.FixtureRequest, flowkit_workflows: list[Any]
    ) -> AsyncIterator[TestEnv]:
        """A running ``TestEnv`` (MemoryStore + VirtualClock)."""
        marker = request.node.get_closest_marker("flowkit")
        opts: dict[str, Any] = dict(marker.kwargs) if marker else {}
        workflows = opts.pop("workflows", None) or flowkit_workflows
        async with TestEnv(workflows, **opts) as env:
            yield env

except ImportError:  # pragma: no cover - pytest-asyncio is part of the test extra
    pass
