"""The client's answer structs (`client.types`) and the API's response models hold the same
bodies: for every model a route of the control plane answers with (and each model inside one),
a struct of the same name with the same fields, each of the same type and the same optionality.
Both sides are read by introspection (pydantic's `model_fields`, msgspec's `structs.fields`), so
a field added, renamed, retyped or made optional on one side alone fails here. The router's
decisions are held to `router.fleet`'s dataclasses the same way."""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec
import pydantic
import pytest

import client.types
from api.main import ROUTERS
from client.schema import CacheGeometry
from client.types import Body
from router.fleet import Decision, EngineScore

Shape = Any  # a type written as plain, comparable data


def shape(tp: Any) -> Shape:
    """`tp` as data both sides write alike: a model or struct by its name, a union as the set
    of its members, a `Literal` as its values, `Annotated` without its metadata."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return shape(typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return ("union", frozenset(shape(arg) for arg in typing.get_args(tp)))
    if origin is Literal:
        return ("literal", frozenset(typing.get_args(tp)))
    if origin is not None:
        return (
            getattr(origin, "__name__", str(origin)),
            tuple(shape(a) for a in typing.get_args(tp)),
        )
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel | msgspec.Struct):
        return ("body", tp.__name__)
    if tp in (int, float, str, bool, datetime.datetime):
        return tp.__name__
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return ("body", tp.__name__)
    raise AssertionError(f"no shape for {tp!r}")


def model_fields(model: type[pydantic.BaseModel]) -> dict[str, tuple[Shape, bool]]:
    """Each field of a pydantic model: its shape and whether a body must carry it."""
    hints = typing.get_type_hints(model, include_extras=True)
    return {
        name: (shape(hints[name]), info.is_required()) for name, info in model.model_fields.items()
    }


def struct_fields(struct: type[msgspec.Struct]) -> dict[str, tuple[Shape, bool]]:
    """Each field of a msgspec struct: its shape and whether a body must carry it."""
    return {f.name: (shape(f.type), f.required) for f in msgspec.structs.fields(struct)}


def dataclass_fields(cls: type) -> dict[str, tuple[Shape, bool]]:
    hints = typing.get_type_hints(cls)
    missing = dataclasses.MISSING
    return {
        f.name: (shape(hints[f.name]), f.default is missing and f.default_factory is missing)
        for f in dataclasses.fields(cls)
    }


def disagreements(
    theirs: dict[str, tuple[Shape, bool]], ours: dict[str, tuple[Shape, bool]]
) -> list[str]:
    """What the client's fields (`ours`) get wrong of a model's (`theirs`), one line a field."""
    found = [f"{name}: only the API has it" for name in theirs.keys() - ours.keys()]
    found += [f"{name}: only the client has it" for name in ours.keys() - theirs.keys()]
    for name in theirs.keys() & ours.keys():
        (their_type, their_required), (our_type, our_required) = theirs[name], ours[name]
        if their_type != our_type:
            found.append(f"{name}: the API's {their_type}, the client's {our_type}")
        if their_required != our_required:
            found.append(f"{name}: required {their_required} in the API, {our_required} here")
    return sorted(found)


def nested_models(tp: Any) -> set[type[pydantic.BaseModel]]:
    """The pydantic models `tp` is or holds, and the models their fields hold, all the way."""
    found: set[type[pydantic.BaseModel]] = set()
    pending = [tp]
    while pending:
        current = pending.pop()
        if isinstance(current, type) and issubclass(current, pydantic.BaseModel):
            if current in found:
                continue
            found.add(current)
            pending.extend(typing.get_type_hints(current, include_extras=True).values())
        else:
            pending.extend(typing.get_args(current))
    return found


def answered_models() -> set[type[pydantic.BaseModel]]:
    """Every model a route of the control plane (`api.main.ROUTERS`) answers with, with those
    inside them."""
    found: set[type[pydantic.BaseModel]] = set()
    for module in ROUTERS:
        for route in module.router.routes:
            found |= nested_models(getattr(route, "response_model", None))
    return found


MODELS = sorted(answered_models(), key=lambda model: model.__name__)


def test_the_api_answers_with_the_models_the_client_knows() -> None:
    structs = {
        name for name in client.types.__all__ if isinstance(getattr(client.types, name), type)
    }
    missing = [model.__name__ for model in MODELS if model.__name__ not in structs]
    assert MODELS and not missing, f"no struct in client.types for {missing}"


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_each_struct_has_its_models_fields(model: type[pydantic.BaseModel]) -> None:
    struct = getattr(client.types, model.__name__)
    assert issubclass(struct, Body)
    assert disagreements(model_fields(model), struct_fields(struct)) == []


@pytest.mark.parametrize("theirs", [Decision, EngineScore], ids=lambda cls: cls.__name__)
def test_a_decision_is_the_routers_record(theirs: type) -> None:
    ours = getattr(client.types, theirs.__name__)
    assert disagreements(dataclass_fields(theirs), struct_fields(ours)) == []


class EngineOutDrifted(Body, kw_only=True):
    """`client.types.EngineOut` as a client would have it after the API changed under it: a
    field gone, one retyped, one made optional, one the API never had."""

    engine_id: str
    epoch: str
    next_seq: int
    connected: bool
    replica_id: str | None = None
    first_seen: datetime.datetime
    last_seen: datetime.datetime
    geometry: CacheGeometry
    model: dict[str, Any]
    num_batches_dropped: int
    num_requests_dropped: int
    last_dropped_at: float


def test_the_comparison_names_every_disagreement() -> None:
    from api.schemas import EngineOut

    assert disagreements(model_fields(EngineOut), struct_fields(EngineOutDrifted)) == [
        "epoch: the API's int, the client's str",
        "last_drop: only the API has it",
        "last_dropped_at: only the client has it",
        "replica_id: required True in the API, False here",
    ]
