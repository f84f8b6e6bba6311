"""A caller without a workflow's code accepts what its code accepts (docs/updates.md, "Callers
without the code"): the body validates a message with pydantic in its lax mode (``"5"`` for an
int, ``"yes"`` for a bool, seconds for a datetime or timedelta, repeats in a set), so the
recorded JSON schema must not refuse those; what pydantic refuses is still refused, nothing
written. And ``import flowkit`` does not load jsonschema (only such callers need it)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flowkit import Engine, WorkflowCtx, workflow
from flowkit._client import schemas as _schemas
from flowkit._model.definition import definition_of
from flowkit.errors import InvalidInputError
from flowkit_testing import TestEnv

try:
    from store_kit import Backend
except ImportError:  # tests/ imported as a package
    from tests.store_kit import Backend

ROOT = Path(__file__).resolve().parent.parent


class Parcel(BaseModel):
    count: Annotated[int, Field(ge=1)]
    weight: float
    fragile: bool
    sent: datetime
    transit: timedelta
    labels: set[str]


@workflow(name="parcels", signals={"parcel": Parcel})
class Parcels:
    """Waits for one parcel, returns how many it holds."""

    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        parcel = await ctx.wait_for_signal("parcel")
        assert isinstance(parcel, Parcel)
        return parcel.count


LAX = {
    "count": "3",
    "weight": "1.5",
    "fragile": "yes",
    "sent": 1_700_000_000,
    "transit": 90,
    "labels": ["a", "a"],
}


async def test_a_caller_without_the_code_accepts_what_pydantic_accepts() -> None:
    async with TestEnv([Parcels()]) as env:
        await env.start("parcels", None, "p1")
        await env.start("parcels", None, "p2")
        await env.run_until_idle()
        client = Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)
        await env.engines[0].signal("p1", "parcel", LAX)  # (the code takes it)
        await client.signal("p2", "parcel", LAX)  # (so the recorded schema takes it too)
        await env.run_until_idle()
        assert await env.result("p1") == await env.result("p2") == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("count", "3x"), ("count", "0"), ("fragile", "maybe"), ("sent", [1]), ("weight", [])],
)
async def test_what_pydantic_refuses_is_still_refused(field: str, value: Any) -> None:
    async with TestEnv([Parcels()]) as env:
        await env.start("parcels", None, "p1")
        await env.run_until_idle()
        client = Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)
        for caller in (env.engines[0], client):
            with pytest.raises(InvalidInputError, match=field):
                await caller.signal("p1", "parcel", {**LAX, field: value})
        assert await env.store.peek_signal("p1", "parcel") is None


def test_importing_flowkit_does_not_import_jsonschema() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = "import flowkit, flowkit_testing, sys; assert 'jsonschema' not in sys.modules"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


class Opaque:
    """A default pydantic cannot put in a JSON schema (it warns, then leaves it out)."""


class Odd:
    """A type whose JSON schema fails with an error of its own."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> Any:
        raise RuntimeError("no schema for Odd")


class WithOpaqueDefault(BaseModel):
    model_config = {"arbitrary_types_allowed": True}
    n: int
    extra: Any = Field(default=Opaque(), exclude=True)


@workflow(name="opaque_default", signals={"odd": Odd})
class OpaqueDefault:
    """Its input's schema warns, its signal's raises: recording them must not stop a worker."""

    async def run(self, ctx: WorkflowCtx, input: WithOpaqueDefault) -> int:
        await ctx.wait_for_signal("odd")
        return input.n


async def test_schemas_pydantic_cannot_make_do_not_stop_the_worker() -> None:
    """Recording is best effort: a warning (an error under ``-W error``, as in this suite)
    or an exception from pydantic's schema generation leaves that schema unchecked, and the
    worker starts and runs the workflow."""
    async with TestEnv([OpaqueDefault()]) as env:
        await env.start("opaque_default", {"n": 4}, "o1")
        await env.run_until_idle()
        client = Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)
        await client.signal("o1", "odd", {"any": "thing"})
        await env.run_until_idle()
        assert await env.result("o1") == 4
        doc = await env.store.workflow_schema("opaque_default", "1")
        assert doc["signals"] == {"odd": {}}
        assert doc["input"]["properties"]["n"] == {"title": "N", "type": "integer"}


async def test_an_unscoped_caller_validates_a_namespaced_run_by_its_namespace_schemas(
    backend: Backend,
) -> None:
    """The tools are unscoped (``flowkit signal``, ``flowkit retry``, the dashboard); a run of
    namespace ``a`` is checked against what the workers of ``a`` recorded, not against an
    unscoped worker's document of another code with the same version (nor against none)."""
    store = backend.store
    # an unscoped worker elsewhere runs other code under the same name and version
    await store.put_workflow_schemas({("parcels", "1"): _schemas.document(definition_of(Loose))})
    async with TestEnv([Parcels()], store=store.scoped("a")) as env:
        await env.start("parcels", None, "p1")
        await env.run_until_idle()
        client = Engine(store, [], clock=env.clock, bus=env.bus, worker=False)
        with pytest.raises(InvalidInputError, match="count"):
            await client.signal("p1", "parcel", {**LAX, "count": "many"})
        assert await env.store.peek_signal("p1", "parcel") is None
        await client.signal("p1", "parcel", LAX)  # (not refused by the other code's names)
        await env.run_until_idle()
        assert await env.result("p1") == 3


@workflow(name="parcels", signals={"other": None})
class Loose:
    """Other code of the same name and version: declares only the signal ``other``."""

    async def run(self, ctx: WorkflowCtx, input: None) -> None:
        await ctx.wait_for_signal("other")


class Tags(BaseModel):
    """Takes its tags as a list or as one comma-separated string (a before-validator)."""

    tags: list[str]

    @field_validator("tags", mode="before")
    @classmethod
    def split(cls, value: Any) -> Any:
        return value.split(",") if isinstance(value, str) else value


class Renamed(BaseModel):
    """Reads the old shape of its payload too (a model before-validator)."""

    qty: int

    @model_validator(mode="before")
    @classmethod
    def upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and "quantity" in data:
            return {"qty": data["quantity"]}
        return data


@workflow(name="reshaped", signals={"tags": Tags, "renamed": Renamed, "plain": Parcel})
class Reshaped:
    """Takes what its validators reshape."""

    async def run(self, ctx: WorkflowCtx, input: None) -> list[Any]:
        tags = await ctx.wait_for_signal("tags")
        renamed = await ctx.wait_for_signal("renamed")
        return [tags.tags, renamed.qty]


async def test_payloads_a_before_validator_reshapes_are_not_refused() -> None:
    """A JSON schema describes a model after its before-validators: what they take (a string
    for a list, an old shape) is not refused by a caller without the code; the schemas of
    types without them are still checked."""
    async with TestEnv([Reshaped()]) as env:
        await env.start("reshaped", None, "r1")
        await env.run_until_idle()
        client = Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)
        await client.signal("r1", "tags", {"tags": "a,b"})
        await client.signal("r1", "renamed", {"quantity": 4})
        with pytest.raises(InvalidInputError, match="count"):
            await client.signal("r1", "plain", {**LAX, "count": "many"})
        await env.run_until_idle()
        assert await env.result("r1") == [["a", "b"], 4]


class Aliased(BaseModel):
    """Takes ``user_id`` by its name or its alias ``userId``."""

    model_config = ConfigDict(populate_by_name=True)
    user_id: int = Field(alias="userId")


class AliasOnly(BaseModel):
    """Takes ``user_id`` by its alias only."""

    user_id: int = Field(alias="userId")


@workflow(name="aliased", signals={"by_either": Aliased, "by_alias": AliasOnly})
class AliasedFlow:
    """Returns the user ids it got."""

    async def run(self, ctx: WorkflowCtx, input: None) -> list[int]:
        either = await ctx.wait_for_signal("by_either")
        alias = await ctx.wait_for_signal("by_alias")
        return [either.user_id, alias.user_id]


async def test_a_field_given_by_its_name_where_the_model_takes_it_is_not_refused() -> None:
    async with TestEnv([AliasedFlow()]) as env:
        await env.start("aliased", None, "a1")
        await env.run_until_idle()
        client = Engine(env.store, [], clock=env.clock, bus=env.bus, worker=False)
        await client.signal("a1", "by_either", {"user_id": 1})  # (its name: taken)
        with pytest.raises(InvalidInputError, match="userId"):  # (its alias only: refused)
            await client.signal("a1", "by_alias", {"user_id": 2})
        await client.signal("a1", "by_alias", {"userId": 2})
        await env.run_until_idle()
        assert await env.result("a1") == [1, 2]
