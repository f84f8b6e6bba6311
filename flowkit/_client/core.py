"""The engine's internal plumbing: what its client modules (``publish``, ``retry``,
``schedules``, ``serve``, ``updates``) use of it beyond its public API (``ClientCore``).

Not for users: an ``Engine`` keeps one (``Engine._core``) and hands it to the module a method
delegates to, with itself; the module reaches the engine's public API through the engine and
its plumbing through the core, never the engine's private members."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .._core import serde as _serde
from .._core.run import Run
from .._model.definition import WorkflowDefinition, definition_of
from .._worker.worker import Worker, WorkerConfig
from ..errors import InvalidInputError, RunNotFoundError, SerializationError, WorkflowNotFoundError
from ..stores import limits

__all__ = ["ClientCore"]


class ClientCore:
    """An engine's plumbing: get a run or raise ``RunNotFoundError``, wake a run, resolve a
    workflow, validate an input, and the engine's running worker (``None`` without one)."""

    __slots__ = ("config", "worker")

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.worker: Worker | None = None

    async def get(self, run_id: str) -> Run:
        """The run ``run_id``, or ``RunNotFoundError``."""
        if not limits.storable(run_id):  # (no store holds such an id)
            raise RunNotFoundError(run_id)
        run = await self.config.store.get_run(run_id)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def wake(self, run_id: str) -> None:
        """Dispatch ``run_id`` to the running worker now (a no-op without one)."""
        if self.worker is not None:
            self.worker.dispatch(run_id)

    def resolve(self, workflow: Any, version: str | None = None) -> WorkflowDefinition:
        """The definition a start names: a name's newest version unless ``version`` pins one;
        a class or instance means its own version (``version``, if given, must agree)."""
        if version is not None and not isinstance(version, str):
            raise TypeError(f"version must be a string, got {type(version).__name__}")
        if isinstance(workflow, str):
            entry = self.config.registry.get(workflow, version)
            if entry is None:
                raise WorkflowNotFoundError(workflow, version)
            return entry[0]
        defn = definition_of(workflow)
        entry = self.config.registry.get(defn.name, defn.version) if defn is not None else None
        if defn is None or entry is None or entry[0] is not defn:
            name = defn.name if defn else getattr(workflow, "__name__", repr(workflow))
            raise WorkflowNotFoundError(name, defn.version if defn else None)
        if version is not None and version != defn.version:
            raise WorkflowNotFoundError(defn.name, version)
        return defn

    def validated(self, defn: WorkflowDefinition, input: Any) -> tuple[Any, Any]:
        """A run's input, validated as ``start`` validates it: the value and its stored JSON;
        ``InvalidInputError`` when it does not fit."""
        try:
            value = defn.input_adapter.validate_python(input)
        except ValidationError as exc:
            raise InvalidInputError(defn.name, str(exc)) from None
        try:
            input_json = _serde.to_json(
                value, defn.input_adapter, "workflow input", self.config.max_payload_bytes
            )
        except SerializationError as exc:
            raise InvalidInputError(defn.name, str(exc)) from None
        return value, input_json

    def validated_input(self, defn: WorkflowDefinition, input: Any) -> Any:
        """``validated``'s stored JSON only (``retry``'s new input)."""
        return self.validated(defn, input)[1]
