"""Checking a message against its type: the one reader of the guest protocol's typed messages.

The message types (``messages``, ``process_messages``, ``code_messages``) are ``TypedDict``s, so
mypy checks what each end writes. What each end *reads* comes from the other side of a trust
boundary (the host reads what a guest it does not trust answers; the agent reads what the host
sends), so ``check`` walks the value against the same type at run time and refuses, naming the
field, anything that does not fit: a missing field, a string where a number goes, an unknown
literal. Keys the type does not name are let through (a newer peer may add some) and readers
ignore them. Bounds (lengths, counts) are the readers' own, checked after this.

Stdlib only: the guest image carries it (``forkd.image.rootfs.GUEST_SHARED_MODULES``).
"""

from __future__ import annotations

import types
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

T = TypeVar("T")

# A request's timeout_secs: its words in a refusal; its bound is ``protocol.request_timeout``'s.
Seconds = Annotated[float, "a positive number"]


class ProtocolError(ValueError):
    """A message that does not fit its type. ``field`` is where, as a path ("entries[3].size";
    "" for the message itself); the message names the action, the field and what it must be."""

    def __init__(self, where: str, field: str, expected: str) -> None:
        super().__init__(f"{where}: {_named(field)} must be {expected}")
        self.field = field
        self.expected = expected


def _named(field: str) -> str:
    """A field's path for a message, its top-level name quoted as handlers quote it ('env'.A)."""
    if not field:
        return "the message"
    cut = min((i for i in (field.find("["), field.find(".")) if i >= 0), default=len(field))
    return f"{field[:cut]!r}{field[cut:]}"


# Each TypedDict's resolved field types, and which fields must be present, worked out once.
_FIELDS: dict[type, tuple[dict[str, Any], frozenset[str]]] = {}


def _fields(shape: type) -> tuple[dict[str, Any], frozenset[str]]:
    known = _FIELDS.get(shape)
    if known is None:
        hints = get_type_hints(shape, include_extras=True)
        # Worked out from the hints rather than ``__required_keys__``, which is wrong for a
        # NotRequired written as a string (``from __future__ import annotations``) before 3.14.
        total = getattr(shape, "__total__", True)
        required = frozenset(name for name, hint in hints.items() if get_origin(hint) is Required
                             or (total and get_origin(hint) is not NotRequired))
        known = _FIELDS[shape] = ({name: _bare(hint) for name, hint in hints.items()}, required)
    return known


def _bare(hint: Any) -> Any:
    """A field's type without its Required/NotRequired qualifier."""
    while get_origin(hint) in (Required, NotRequired):
        hint = get_args(hint)[0]
    return hint


_SCALARS: dict[Any, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    bool: ((bool,), "a boolean"),
    type(None): ((type(None),), "null"),
    None: ((type(None),), "null"),
}


def _describe(hint: Any) -> str:
    """What a value of ``hint`` is, in words, for an error message (an ``Annotated`` type's
    words are its first string: ``Annotated[float, "a positive number"]``)."""
    origin = get_origin(hint)
    if origin is Annotated:
        return next((m for m in hint.__metadata__ if isinstance(m, str)), None) or _describe(hint.__origin__)
    if hint in _SCALARS:
        return _SCALARS[hint][1]
    if origin is Union or isinstance(hint, types.UnionType):
        return " or ".join(_describe(arg) for arg in get_args(hint))
    if origin is Literal:
        return "one of " + ", ".join(repr(arg) for arg in get_args(hint))
    if origin is list:
        return f"a list of {_describe(get_args(hint)[0])}"
    if origin is dict or is_typeddict(hint):
        return "an object"
    return "a value"


def _fits(hint: Any, value: object, where: str, path: str) -> None:
    """Raise ``ProtocolError`` unless ``value`` is of type ``hint``."""
    if hint is Any:
        return
    origin = get_origin(hint)
    if origin is Annotated:
        try:
            _fits(hint.__origin__, value, where, path)
            return
        except ProtocolError as exc:
            if exc.field != path:
                raise
    elif hint in _SCALARS:
        kinds = _SCALARS[hint][0]
        # JSON has no integer type apart from its numbers, but a bool is never a number here.
        if isinstance(value, kinds) and (hint is bool or not isinstance(value, bool)):
            return
    elif origin is Union or isinstance(hint, types.UnionType):
        for arg in get_args(hint):
            try:
                _fits(arg, value, where, path)
                return
            except ProtocolError as exc:
                if exc.field != path:  # it is of this type, but a part inside it is not
                    raise
    elif origin is Literal:
        if any(value == arg and type(value) is type(arg) for arg in get_args(hint)):
            return
    elif origin is list:
        if isinstance(value, list):
            (item,) = get_args(hint)
            for i, element in enumerate(value):
                _fits(item, element, where, f"{path}[{i}]")
            return
    elif origin is dict:
        if isinstance(value, dict):
            _, item = get_args(hint)
            for key, element in value.items():
                if not isinstance(key, str):
                    raise ProtocolError(where, path, "an object with string keys")
                _fits(item, element, where, f"{path}.{key}" if path else key)
            return
    elif is_typeddict(hint):
        if isinstance(value, dict):
            _object(hint, value, where, path)
            return
    else:
        raise TypeError(f"schema cannot check {hint!r}")  # a type this module does not know: a bug here
    raise ProtocolError(where, path, _describe(hint))


def _object(shape: type, value: dict[str, Any], where: str, path: str) -> None:
    fields, required = _fields(shape)
    for name, hint in fields.items():
        inner = f"{path}.{name}" if path else name
        if name in value:
            _fits(hint, value[name], where, inner)
        elif name in required:
            raise ProtocolError(where, inner, f"present ({_describe(hint)})")


def check(shape: type[T], value: object, where: str) -> T:
    """``value`` as a ``shape`` (a TypedDict), once it is checked to fit; ``ProtocolError`` naming
    the first field that does not. ``where`` says what the message is ("the proc_info reply")."""
    if not isinstance(value, dict):
        raise ProtocolError(where, "", "an object")
    _object(shape, value, where, "")
    return cast(T, value)


__all__ = ["ProtocolError", "Seconds", "check"]
