"""The response models are derived from the controller's result records (api/schemas/derive.py):
one definition of each shape, and a model cannot restate what its record says."""

from __future__ import annotations

from typing import Annotated, NotRequired, TypedDict, get_args, get_type_hints

import pytest
from pydantic import Field

from forkd.api.schemas import responses
from forkd.api.schemas.common import ResponseModel
from forkd.api.schemas.derive import DERIVED, _unwrap, derived_from
from forkd.controller import results
from forkd.controller.results import Wire


class Inner(TypedDict):
    n: int


class Record(TypedDict):
    name: Annotated[str, Wire("Its name.", examples=["x"])]
    size: NotRequired[int]
    flag: Annotated[bool, Wire(default=False)]
    secret: NotRequired[Annotated[str, Wire(listed=False)]]


class WithNested(TypedDict):
    inner: Annotated[list[Inner], Wire("The inner ones.")]


def test_a_record_makes_the_model_with_its_docs_defaults_and_order() -> None:
    @derived_from(Record)
    class Out(ResponseModel):
        pass

    assert list(Out.model_fields) == ["name", "size", "flag"]  # the record's order; secret unlisted
    schema = Out.model_json_schema()
    assert schema["title"] == "Out"
    assert schema["required"] == ["name"]
    assert schema["properties"]["name"]["description"] == "Its name."
    assert schema["properties"]["name"]["examples"] == ["x"]
    # NotRequired without a default: nullable, null when missing (as the SDKs read it).
    assert schema["properties"]["size"]["anyOf"] == [{"type": "integer"}, {"type": "null"}]
    assert schema["properties"]["size"]["default"] is None
    assert schema["properties"]["flag"]["default"] is False
    # Response models keep what they do not list: the unlisted key still reaches the client.
    assert Out.model_validate({"name": "a", "flag": True, "secret": "s"}).model_dump()["secret"] == "s"


def test_the_body_names_a_nested_model_and_the_record_keeps_its_docs() -> None:
    class InnerOut(ResponseModel):
        n: int

    @derived_from(WithNested)
    class Out(ResponseModel):
        inner: list[InnerOut]

    field = Out.model_fields["inner"]
    assert field.annotation == list[InnerOut]
    assert field.description == "The inner ones."


def test_a_nested_record_must_be_named_as_a_model() -> None:
    with pytest.raises(TypeError, match="nested record"):
        @derived_from(WithNested)
        class Out(ResponseModel):
            pass


def test_the_body_cannot_restate_what_the_record_says() -> None:
    with pytest.raises(TypeError, match="give its type only"):
        @derived_from(Record)
        class Described(ResponseModel):
            name: str = Field(description="Said twice.")
    with pytest.raises(TypeError, match="not in Record"):
        @derived_from(Record)
        class Stray(ResponseModel):
            other: int
    with pytest.raises(TypeError, match="leaves it out"):
        @derived_from(Record)
        class Unlisted(ResponseModel):
            secret: str


def test_every_derived_model_has_exactly_its_records_listed_keys() -> None:
    derived = [(model, record) for model, record in DERIVED.items() if model.__module__ == responses.__name__]
    assert {model.__name__ for model, _ in derived} >= {
        "ExecResponse", "FileInfo", "FileList", "ProcessInfo", "PoolInfo", "PromoteResponse",
        "CheckpointList", "WorkspaceInfo", "PushResult", "PullResult", "BuildContextInfo"}
    for model, record in derived:
        listed = [key for key, hint in get_type_hints(record, include_extras=True).items()
                  if _unwrap(hint)[2].listed]
        assert list(model.model_fields) == listed, model.__name__
        assert getattr(results, record.__name__) is record


def test_unwrap_reads_not_required_outside_or_inside_annotated() -> None:
    wire = Wire("d")
    assert _unwrap(NotRequired[Annotated[int, wire]]) == (int, False, wire)
    assert _unwrap(Annotated[NotRequired[int], wire]) == (int, False, wire)
    kind, required, _ = _unwrap(Annotated[list[str], wire])
    assert (get_args(kind), required) == ((str,), True)
