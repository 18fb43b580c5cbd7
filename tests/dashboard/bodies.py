"""REST bodies for the dashboard's pure functions, as `client.types` structs: `body(EngineOut,
{...})` takes the fields a test cares about and fills every other field a struct requires with
an empty value of its type (0, "", False, [], {}, None, the epoch), at any depth, so a test
writes the part of a body it checks, as before, and the function under test reads fields."""

from __future__ import annotations

import datetime
import types
import typing
from typing import Any, Literal, TypeVar, Union

import msgspec

EPOCH = "1970-01-01T00:00:00"
T = TypeVar("T")


def body(struct: type[T], data: dict | None = None) -> T:
    """`data` (a body's JSON, in part) as `struct`, its missing required fields empty."""
    return msgspec.convert(filled(struct, data or {}), struct)


def filled(tp: Any, data: Any) -> Any:
    """`data` with what `tp` requires and it lacks, empty; lists and dicts of structs too."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        structs = [a for a in args if _is_struct(a)]
        return filled(structs[0], data) if structs and isinstance(data, dict) else data
    if _is_struct(tp) and isinstance(data, dict):
        out = dict(data)
        for field in msgspec.structs.fields(tp):
            if field.name in out:
                out[field.name] = filled(field.type, out[field.name])
            elif field.required:
                out[field.name] = empty(field.type)
        return out
    if origin is list and isinstance(data, list):
        return [filled(args[0], item) for item in data]
    if origin is dict and isinstance(data, dict):
        return {key: filled(args[1], value) for key, value in data.items()}
    return data


def empty(tp: Any) -> Any:
    """An empty value of `tp`: None when it may be None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return None if type(None) in args else empty(args[0])
    if origin is Literal:
        return args[0]
    if origin is list or origin is tuple:
        return []
    if origin is dict or tp is dict:
        return {}
    if _is_struct(tp):
        return filled(tp, {})
    if tp is datetime.datetime:
        return EPOCH
    return {int: 0, float: 0.0, str: "", bool: False}.get(tp, None)


def _is_struct(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct)
