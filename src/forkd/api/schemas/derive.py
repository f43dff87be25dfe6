"""A response model derived from the controller's result record (``controller/results.py``).

A record's keys, their types, which are required and what the wire says of them
(``Wire``) are written once, in the record; ``derived_from`` builds the pydantic
model the routes answer with, so the two cannot drift. The decorated class names
only the keys whose wire type differs from the record's (a nested response model
where the record carries a record's JSON or a nested record), by annotation
alone: their description and default still come from the record.

mypy sees the decorated class with the body's fields only; every use of these
models above the controller is ``response_model=`` or ``model_validate``, which
need no more.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import (
    Annotated,
    Any,
    NotRequired,
    Optional,
    Required,
    TypeVar,
    cast,
    get_args,
    get_origin,
    get_type_hints,
)

from pydantic import BaseModel, Field, create_model
from pydantic_core import PydanticUndefined

from forkd.controller.results import REQUIRED, Wire

M = TypeVar("M", bound=BaseModel)

# Each derived model and its record, for the test that holds them to each other.
DERIVED: dict[type[BaseModel], type] = {}


def _unwrap(hint: Any) -> tuple[Any, bool, Wire]:
    """A record key's type, whether it is required, and its ``Wire`` (an empty one if none)."""
    required, wire = True, Wire()
    while True:
        origin = get_origin(hint)
        if origin is NotRequired or origin is Required:
            required = origin is Required
            hint = get_args(hint)[0]
        elif origin is Annotated:
            wire = next((m for m in hint.__metadata__ if isinstance(m, Wire)), wire)
            hint = hint.__origin__
        else:
            return hint, required, wire


def _has_record(hint: Any) -> bool:
    """Whether a nested record hides in ``hint`` (its response model must be named instead)."""
    return typing.is_typeddict(hint) or any(_has_record(arg) for arg in get_args(hint))


def derived_from(record: type) -> Callable[[type[M]], type[M]]:
    """The class decorated, rebuilt with every listed key of ``record`` as a field, in its order."""

    def derive(cls: type[M]) -> type[M]:
        named = cls.model_fields
        fields: dict[str, Any] = {}
        for key, hint in get_type_hints(record, include_extras=True).items():
            kind, required, wire = _unwrap(hint)
            if not wire.listed:
                if key in named:
                    raise TypeError(f"{cls.__name__}.{key}: the record leaves it out of the wire")
                continue
            if key in named:
                given = named[key]
                # One source: the body says what type the wire carries, the record the rest.
                if given.default is not PydanticUndefined or given.description or given.examples:
                    raise TypeError(f"{cls.__name__}.{key}: give its type only; the rest is "
                                    f"{record.__name__}'s")
                kind = given.annotation
            elif _has_record(kind):
                raise TypeError(f"{cls.__name__}.{key}: name the response model of {record.__name__}'s "
                                "nested record")
            default: Any = wire.default
            if default is REQUIRED:
                # A key the record may leave out reads as null on the wire, as the SDKs see it.
                default, kind = (..., kind) if required else (None, Optional[kind])  # noqa: UP045
            fields[key] = (kind, Field(default, description=wire.description, examples=wire.examples))
        stray = set(named) - set(fields)
        if stray:
            raise TypeError(f"{cls.__name__}: {sorted(stray)} not in {record.__name__}")
        model: type[BaseModel] = create_model(cls.__name__, __base__=cls.__bases__, __module__=cls.__module__,
                                              __doc__=cls.__doc__, **fields)
        DERIVED[model] = record
        return cast(type[M], model)

    return derive
