"""The base of every message that crosses a process boundary: a frozen dataclass that
writes itself as a list of its fields (nested messages as lists of theirs) and reads itself
back, checking each field against its annotation, since a frame from a foreign or broken
sender must fail where it is read, not deep in the engine or a frontend's listener. The
messages themselves and the frame around them are ``protocol.py``'s.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar


class ProtocolError(ValueError):
    """A frame that does not decode into a known message of this protocol version."""


M = TypeVar("M", bound="Message")


@dataclass(frozen=True, slots=True)
class Message:
    """Base of all messages: ``TAG`` identifies the type on the wire; ``NESTED`` names fields
    that hold other messages (a class, or a one-element list for a list of them)."""

    TAG: ClassVar[int] = 0
    NESTED: ClassVar[dict[str, Any]] = {}

    def to_wire(self) -> list[Any]:
        return [_encode_field(getattr(self, name)) for name in _names(type(self))]

    @classmethod
    def from_wire(cls: type[M], items: list[Any]) -> M:
        names = _names(cls)
        # Fewer items than fields is fine when the missing ones have defaults: a field added
        # at the end with a default keeps frames of a sender without it decodable.
        if not isinstance(items, list) or len(items) > len(names):
            raise ProtocolError(f"{cls.__name__}: expected {len(names)} fields")
        values = {}
        for name, raw in zip(names, items, strict=False):
            nested = cls.NESTED.get(name)
            if nested is None:
                values[name] = raw
            elif isinstance(nested, list):
                if not isinstance(raw, list):
                    raise ProtocolError(f"{cls.__name__}.{name}: expected a list")
                values[name] = [nested[0].from_wire(x) for x in raw]
            else:
                values[name] = nested.from_wire(raw)
        _check_types(cls, values)
        try:
            return cls(**values)
        except TypeError as exc:
            raise ProtocolError(f"{cls.__name__}: {exc}") from exc


def _check_types(cls: type[Message], values: dict[str, Any]) -> None:
    # A frame from a foreign or broken sender must fail here, not deep in the engine or a
    # frontend's listener, where a str for an int would crash the loop.
    checks = _field_checks(cls)
    for name, value in values.items():
        if name in checks and not checks[name](value):
            raise ProtocolError(f"{cls.__name__}.{name}: wrong type {type(value).__name__}")
    # Every reply to a frontend goes out under topic(frontend_id), which must encode.
    frontend_id = values.get("frontend_id")
    if frontend_id is not None and not frontend_id.isascii():
        raise ProtocolError(f"{cls.__name__}.frontend_id: not ASCII, so not a topic")


_CHECKS: dict[type[Message], dict[str, Callable[[Any], bool]]] = {}
_NAMES: dict[type[Message], tuple[str, ...]] = {}


def _names(cls: type[Message]) -> tuple[str, ...]:
    """A message's field names in wire order, looked up once per class (every update of
    every tick goes through here, both ways)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _field_checks(cls: type[Message]) -> dict[str, Callable[[Any], bool]]:
    checks = _CHECKS.get(cls)
    if checks is None:
        hints = typing.get_type_hints(cls)
        checks = {
            f.name: _type_check(hints[f.name])
            for f in dataclasses.fields(cls)
            if f.name not in cls.NESTED
        }
        _CHECKS[cls] = checks
    return checks


# msgpack decodes to exactly these types; a bool is not accepted as a number.
_PLAIN: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({int, float}),  # a whole number may travel as an int
    str: frozenset({str}),
    bytes: frozenset({bytes}),
    bool: frozenset({bool}),
}


def _type_check(hint: Any) -> Callable[[Any], bool]:
    """A predicate for the field annotations this module uses (msgpack's decoded types)."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if hint is Any:
        return lambda value: True
    if hint in _PLAIN:
        allowed = _PLAIN[hint]
        return lambda value: type(value) in allowed
    if hint is type(None):
        return lambda value: value is None
    if origin in (types.UnionType, typing.Union):
        options = [_type_check(arg) for arg in args]
        return lambda value: any(check(value) for check in options)
    if origin is list and args[0] in _PLAIN:  # token ids: one C-level pass over the types
        items = _PLAIN[args[0]]
        return lambda value: type(value) is list and set(map(type, value)) <= items
    if origin is list:
        item = _type_check(args[0])
        return lambda value: type(value) is list and all(map(item, value))
    assert origin is dict, hint
    key, val = _type_check(args[0]), _type_check(args[1])
    return lambda value: type(value) is dict and all(key(k) and val(v) for k, v in value.items())


def _encode_field(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_wire()
    if isinstance(value, list) and value and isinstance(value[0], Message):
        return [v.to_wire() for v in value]
    return value
