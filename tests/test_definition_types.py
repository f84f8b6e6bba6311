"""``@workflow`` resolves ``run``'s input and output annotations (and a step's return
annotation) to real types, or says which name is missing: never a silent ``Any`` that lets bad
input in and fails the run later with ``'dict' object has no attribute ...``.

This module uses ``from __future__ import annotations`` on purpose: every annotation in it is
a string that flowkit must resolve, as in most typed code bases."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import pytest
from pydantic import BaseModel, Field

import flowkit
from flowkit import Engine, WorkflowCtx, workflow
from flowkit._model.definition import definition_of
from flowkit.stores import MemoryStore, SqlStore

if TYPE_CHECKING:
    from decimal import Decimal as OnlyForTypeCheckers


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'flowkit.db'}"


async def assert_no_run_written(url: str, run_id: str) -> None:
    """A second handle on the database file finds neither the run nor its history."""
    store = SqlStore(url)
    try:
        assert await store.get_run(run_id) is None
        assert await store.list_runs() == []
        with pytest.raises(flowkit.RunNotFoundError):
            await store.load_events(run_id)
    finally:
        store.close()


# -- a model defined in the test function (the common pytest case) ------------------------


async def test_function_local_model_validates_input_and_bad_input_writes_nothing(
    tmp_path: Path,
) -> None:
    class Job(BaseModel):
        n: int

    class Result(BaseModel):
        doubled: int

    @workflow(name="local-model")
    class LocalModel:
        async def run(self, ctx: WorkflowCtx, job: Job) -> Result:
            return Result(doubled=job.n * 2)

    defn = definition_of(LocalModel)
    assert defn is not None
    assert defn.input_type is Job and defn.output_type is Result

    url = sqlite_url(tmp_path)
    async with Engine(SqlStore(url), [LocalModel()]) as engine:
        with pytest.raises(flowkit.InvalidInputError) as ei:
            await engine.start("local-model", {"m": 1}, "bad")
        assert ei.value.workflow == "local-model"
        assert "n" in ei.value.detail
    await assert_no_run_written(url, "bad")

    async with Engine(SqlStore(url), [LocalModel()]) as engine:
        await engine.start("local-model", {"n": "21"}, "good")  # coerced by the model
        assert await engine.result("good", timeout=10) == Result(doubled=42)
        assert (await engine.get_run("good")).input == {"n": 21}


async def test_bare_decorator_and_class_body_names_resolve() -> None:
    class Job(BaseModel):
        n: int

    @workflow
    class Bare:
        async def run(self, ctx: WorkflowCtx, job: Job) -> int:
            return job.n

    @workflow(name="nested")
    class Nested:
        class Input(BaseModel):
            text: str

        async def run(self, ctx: WorkflowCtx, input: Input) -> str:
            return input.text.upper()

    bare, nested = definition_of(Bare), definition_of(Nested)
    assert bare is not None and bare.input_type is Job
    assert nested is not None and nested.input_type is Nested.Input
    async with Engine(MemoryStore(), [Bare(), Nested()]) as engine:
        with pytest.raises(flowkit.InvalidInputError):
            await engine.start("nested", {"txt": "x"}, "bad")
        assert await engine.list_runs() == []
        await engine.start("nested", {"text": "hi"}, "good")
        assert await engine.result("good", timeout=10) == "HI"


def test_run_inherited_from_a_base_resolves_in_the_base_scope() -> None:
    class Job(BaseModel):
        n: int

    class Base:
        async def run(self, ctx: WorkflowCtx, job: Job) -> list[Job]:
            return [job]

    @workflow(name="child")
    class Child(Base):
        pass

    @workflow(name="base-flow")
    class BaseFlow:
        async def run(self, ctx: WorkflowCtx, job: Job) -> int:
            return job.n

    def elsewhere() -> type:
        @workflow(name="grandchild")  # (another function: the names of BaseFlow's)
        class GrandChild(BaseFlow):
            pass

        return GrandChild

    child, grandchild = definition_of(Child), definition_of(elsewhere())
    assert child is not None and child.input_type is Job and child.output_type == list[Job]
    assert grandchild is not None and grandchild.input_type is Job


async def test_annotated_constraints_are_validated() -> None:
    """``Annotated`` metadata is part of the type: ``Field(gt=0)`` rejects 0 at start."""

    @workflow(name="positive")
    class Positive:
        async def run(self, ctx: WorkflowCtx, n: Annotated[int, Field(gt=0)]) -> int:
            return n

    async with Engine(MemoryStore(), [Positive()]) as engine:
        with pytest.raises(flowkit.InvalidInputError):
            await engine.start("positive", 0, "zero")
        assert await engine.list_runs() == []
        await engine.start("positive", 3, "three")
        assert await engine.result("three", timeout=10) == 3


async def test_a_ctx_annotation_imported_only_for_type_checkers_does_not_matter(
    tmp_path: Path,
) -> None:
    """Only the input and return annotations are resolved: the usual
    ``if TYPE_CHECKING: from flowkit import WorkflowCtx`` must not turn validation off."""
    mod = import_module_source(
        tmp_path,
        "ctx_typing_only",
        """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from pydantic import BaseModel
        from flowkit import workflow
        if TYPE_CHECKING:
            from flowkit import WorkflowCtx

        class Job(BaseModel):
            n: int

        @workflow(name="ctx-typing-only")
        class CtxTypingOnly:
            async def run(self, ctx: WorkflowCtx, job: Job) -> int:
                return job.n + 1
        """,
    )
    url = sqlite_url(tmp_path)
    async with Engine(SqlStore(url), [mod.CtxTypingOnly()]) as engine:
        with pytest.raises(flowkit.InvalidInputError):
            await engine.start("ctx-typing-only", {"n": "x"}, "bad")
    await assert_no_run_written(url, "bad")


# -- a model defined later in the module ----------------------------------------------------


@workflow(name="later-model")
class LaterModelFlow:
    async def run(self, ctx: WorkflowCtx, order: LaterOrder) -> LaterReceipt:
        return LaterReceipt(total=order.qty * order.price)


class LaterOrder(BaseModel):
    qty: int
    price: int


class LaterReceipt(BaseModel):
    total: int


async def test_model_defined_later_in_the_module(tmp_path: Path) -> None:
    """Decoration ran before ``LaterOrder`` existed: the types are resolved at first use."""
    defn = definition_of(LaterModelFlow)
    assert defn is not None
    assert defn.input_type is LaterOrder and defn.output_type is LaterReceipt
    url = sqlite_url(tmp_path)
    async with Engine(SqlStore(url), [LaterModelFlow()]) as engine:
        with pytest.raises(flowkit.InvalidInputError):
            await engine.start("later-model", {"qty": 2}, "bad")
        await engine.start("later-model", {"qty": 2, "price": 5}, "good")
        assert await engine.result("good", timeout=10) == LaterReceipt(total=10)
        assert [r.id for r in await engine.list_runs()] == ["good"]


def test_model_defined_later_in_an_imported_module(tmp_path: Path) -> None:
    """The same in a module imported for real: its definition resolves when first used."""
    mod = import_module_source(
        tmp_path,
        "later_in_module",
        """
        from __future__ import annotations
        from pydantic import BaseModel
        from flowkit import WorkflowCtx, workflow

        @workflow(name="later")
        class Later:
            async def run(self, ctx: WorkflowCtx, job: Job) -> list[Job]:
                return [job]

        class Job(BaseModel):
            n: int
        """,
    )
    Engine(MemoryStore(), [mod.Later()])
    defn = definition_of(mod.Later)
    assert defn is not None
    assert defn.input_type is mod.Job and defn.output_type == list[mod.Job]


# -- names that cannot be resolved ------------------------------------------------------


def test_unresolvable_name_in_a_function_raises_at_decoration() -> None:
    with pytest.raises(TypeError) as ei:

        @workflow(name="typo")
        class Typo:
            async def run(self, ctx: WorkflowCtx, job: Jobb) -> None:  # type: ignore[name-defined]  # noqa: F821
                return None

    text = str(ei.value)
    assert "Typo" in text and "'typo'" in text  # the class and the workflow
    assert "'Jobb'" in text and "parameter 'job'" in text  # the annotation and where
    assert "name 'Jobb' is not defined" in text
    assert isinstance(ei.value.__cause__, NameError)


def test_unresolvable_return_annotation_raises_at_decoration() -> None:
    with pytest.raises(
        TypeError, match=r"'OnlyForTypeCheckers' of run\(\)'s return.*TYPE_CHECKING"
    ):

        @workflow(name="typing-only-output")
        class TypingOnlyOutput:
            async def run(self, ctx: WorkflowCtx, n: int) -> OnlyForTypeCheckers:
                raise AssertionError("never runs")


def test_unresolvable_name_at_module_level_raises_when_first_used(tmp_path: Path) -> None:
    """A module-level workflow whose annotation names a type imported only under
    ``TYPE_CHECKING``: importing the module works (a later line could have defined it), and
    registering the workflow raises ``TypeError`` naming it, before any run exists."""
    mod = import_module_source(
        tmp_path,
        "typing_only_input",
        """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from flowkit import WorkflowCtx, workflow
        if TYPE_CHECKING:
            from decimal import Decimal

        @workflow(name="typing-only-input")
        class TypingOnlyInput:
            async def run(self, ctx: WorkflowCtx, amount: Decimal) -> None:
                return None
        """,
    )
    for attempt in (
        lambda: Engine(MemoryStore(), [mod.TypingOnlyInput()]),
        lambda: definition_of(mod.TypingOnlyInput),
        lambda: flowkit.replay(flowkit.History("r", []), mod.TypingOnlyInput),
    ):
        with pytest.raises(TypeError) as ei:
            attempt()
        text = str(ei.value)
        assert "'typing-only-input'" in text and "'Decimal'" in text
        assert "name 'Decimal' is not defined" in text and "TYPE_CHECKING" in text


# -- no annotation ---------------------------------------------------------------------


async def test_no_annotation_means_any_json(tmp_path: Path) -> None:
    @workflow(name="untyped")
    class Untyped:
        async def run(self, ctx, input):  # type: ignore[no-untyped-def]
            return {"got": input}

    defn = definition_of(Untyped)
    assert defn is not None and defn.input_type is Any and defn.output_type is Any
    url = sqlite_url(tmp_path)
    async with Engine(SqlStore(url), [Untyped()]) as engine:
        await engine.start("untyped", {"anything": [1, "two"]}, "r1")
        assert await engine.result("r1", timeout=10) == {"got": {"anything": [1, "two"]}}
        with pytest.raises(flowkit.InvalidInputError):  # still JSON only
            await engine.start("untyped", object(), "r2")
        assert [r.id for r in await engine.list_runs()] == ["r1"]


# -- a step's result type --------------------------------------------------------------


async def test_step_returning_a_function_local_model_replays_as_the_model(
    tmp_path: Path,
) -> None:
    """Step results typed with models local to the test function come back from the recorded
    history as those models, not as dicts: a local function (which closes over ``Item``) and a
    method of a local service (which does not: its annotation is resolved with the local
    names of the function that declared the running workflow)."""

    class Item(BaseModel):
        n: int

    def make(n: int) -> Any:
        return Item(n=n)

    class Catalog:
        async def fetch(self, n: int) -> Item:
            return make(n)  # type: ignore[no-any-return]

    async def fetch_plain(n: int) -> Item:
        return Item(n=n)

    @workflow(name="local-step")
    class LocalStep:
        def __init__(self, catalog: Catalog) -> None:
            self.catalog = catalog

        async def run(self, ctx: WorkflowCtx, n: int) -> int:
            a = await ctx.step(self.catalog.fetch, n)
            b = await ctx.step(fetch_plain, n + 1)
            assert type(a) is Item and type(b) is Item, (a, b)
            return a.n + b.n

    async with Engine(SqlStore(sqlite_url(tmp_path)), [LocalStep(Catalog())]) as engine:
        await engine.start("local-step", 20, "r1")
        assert await engine.result("r1", timeout=10) == 41
        history = await engine.history("r1")
    assert history.types == ["run_started", "step_completed", "step_completed", "run_completed"]
    await flowkit.replay_async(history, LocalStep(Catalog()))  # the body again, from the history


async def test_step_with_an_unresolvable_return_type_fails_clearly() -> None:
    """A step annotated with a type imported only for type checkers fails the run with a
    TypeError naming the step and the name, instead of replaying its result as plain JSON."""

    async def lookup() -> OnlyForTypeCheckers:
        return 1  # type: ignore[return-value]

    @workflow(name="typing-only-step")
    class TypingOnlyStep:
        async def run(self, ctx: WorkflowCtx, n: int) -> None:
            await ctx.step(lookup)

    async with Engine(MemoryStore(), [TypingOnlyStep()]) as engine:
        await engine.start("typing-only-step", 1, "r1")
        with pytest.raises(flowkit.WorkflowFailedError) as ei:
            await engine.result("r1", timeout=10)
        assert ei.value.error["type"] == "TypeError"
        message = ei.value.error["message"]
        assert "lookup" in message and "'OnlyForTypeCheckers'" in message
        assert "name 'OnlyForTypeCheckers' is not defined" in message
        assert "step_completed" not in (await engine.history("r1")).types


# -- helpers -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _forget_imported_modules() -> Iterator[None]:
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name in _IMPORTED:
            del sys.modules[name]


_IMPORTED: set[str] = set()


def import_module_source(tmp_path: Path, name: str, source: str) -> Any:
    """Write ``source`` to ``tmp_path/name.py`` and import it as a real module."""
    (tmp_path / name).with_suffix(".py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(tmp_path))
    try:
        _IMPORTED.add(name)
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp_path))
