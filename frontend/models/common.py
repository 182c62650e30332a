"""The rules every request body follows (docs/architecture.md, "The API declared once"),
and how replies are written. The field types built from these rules are in ``fields``."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import annotated_types as at
from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

# Error types of our own rules; ``parse`` turns them into 400s.
RULE = "rule"  # "must be <phrase>" (``expect``)
UNICODE = "unicode"
UNSUPPORTED = "unsupported_parameter"  # also the 400's code
CROSS_FIELD = "cross_field"  # ctx "field": the field at fault, below the error's location
OWN_ERRORS = frozenset({RULE, UNICODE, UNSUPPORTED, CROSS_FIELD})

IGNORED = "accepted and ignored"
JSON = "application/json"


class Body(BaseModel):
    """An object of a request body: strict types (a bool is never a number, a string never a
    number); unknown fields kept aside and reported as ignored (``ignored_fields``); in the
    document every optional property may be null. Where null means a default other than None,
    the field says so (``| None``), or the object is a ``Request``: nested objects are
    validated many times per body, so they skip its Python validator."""

    model_config = ConfigDict(extra="allow", strict=True)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        target = handler.resolve_ref_schema(json_schema)
        required = set(target.get("required", ()))
        properties = target.get("properties", {})
        for name, prop in properties.items():
            if name not in required:
                properties[name] = _nullable(prop)
        return json_schema


class Request(Body):
    """A request body: null means the default of any of its known fields."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        # An unknown field stays, null or not, so that it is still reported.
        if not isinstance(data, dict):
            return data
        known = _input_names(cls)
        return {k: v for k, v in data.items() if v is not None or k not in known}


@functools.cache
def _input_names(model: type[BaseModel]) -> frozenset[str]:
    """The keys a body of ``model`` may hold: its fields' names, or their aliases."""
    return frozenset(info.alias or name for name, info in model.model_fields.items())


class Reply(BaseModel):
    """A reply body, or an object inside one: what it declares, nothing else. In the document
    every field is required but those left out when they have no value (``is_none``)."""

    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


def is_none(value: Any) -> bool:
    """``exclude_if`` of a reply field that is left out when it has no value."""
    return value is None


def to_json(reply: BaseModel, exclude: set[str] | None = None) -> str:
    """``reply`` as JSON text, spaced as Python's json module writes it (as before the
    models: clients and tests may read the text)."""
    # fallback=str: an engine timeline value JSON cannot hold must not break a finished reply.
    data = reply.model_dump(mode="json", fallback=str, exclude=exclude)
    return json.dumps(data, ensure_ascii=False)


def json_response(
    reply: BaseModel, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """``reply`` as an HTTP response."""
    return web.Response(text=to_json(reply), status=status, headers=headers, content_type=JSON)


def _nullable(prop: JsonSchemaValue) -> JsonSchemaValue:
    notes: JsonSchemaValue = {k: prop[k] for k in ("description", "default") if k in prop}
    core = {k: v for k, v in prop.items() if k not in notes}
    if not core or {"type": "null"} in core.get("anyOf", ()) or None in core.get("enum", ()):
        return prop  # null is valid already
    options = core["anyOf"] if list(core) == ["anyOf"] else [core]
    return {"anyOf": [*options, {"type": "null"}], **notes}


def _integral(value: Any) -> Any:
    # JSON has one number type: 2.0 is the integer 2 (JSON Schema agrees, and so do clients
    # that compute a count by division).
    return int(value) if type(value) is float and value.is_integer() else value


INTEGRAL = BeforeValidator(_integral)


def expect(phrase: str) -> WrapValidator:
    """Report any failure of the value as "must be ``phrase``"; errors of our own rules inside
    it (not valid Unicode, a feature we lack) pass through as they are."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            own = next((e for e in exc.errors() if e["type"] in OWN_ERRORS), None)
            if own is not None:
                raise _error(own["type"], own["msg"]) from None
            raise _error(RULE, f"must be {phrase}") from None

    return WrapValidator(check)


@dataclass(frozen=True)
class Integer(at.GroupedMetadata):
    """Bounds of an integer field (2.0 is 2), and the 400 that states them:
    ``Annotated[int, Integer(1, 16)]``; no ``high``: no upper bound."""

    low: int
    high: int | None = None

    def __iter__(self) -> Iterator[Any]:
        low, high = self.low, self.high
        rule = f"of at least {low}" if high is None else f"between {low} and {high}"
        yield from (at.Interval(ge=low, le=high), INTEGRAL, expect(f"an integer {rule}"))


@dataclass(frozen=True)
class Number(at.GroupedMetadata):
    """Bounds of a number field, and the 400 that states them:
    ``Annotated[float, Number(0, 2)]``; ``above_low``: ``low`` itself is out."""

    low: float
    high: float
    above_low: bool = False

    def __iter__(self) -> Iterator[Any]:
        low, high = self.low, self.high
        if self.above_low:
            yield from (at.Interval(gt=low, le=high), expect(f"a number in ({low}, {high}]"))
        else:
            yield from (at.Interval(ge=low, le=high), expect(f"a number between {low} and {high}"))


def _error(type_: str, message: str, **ctx: Any) -> PydanticCustomError:
    # The message goes through the context: a template would read its braces as fields.
    return PydanticCustomError(type_, "{message}", {"message": message, **ctx})


def cross_field(field: str, message: str) -> PydanticCustomError:
    """A rule across fields broken, for a model validator: ``field`` is the one reported."""
    return _error(CROSS_FIELD, message, field=field)


def unsupported(detail: str) -> PydanticCustomError:
    """A value that asks for a feature this server does not have."""
    return _error(UNSUPPORTED, f"is not supported: {detail}")


def _unicode(value: str) -> str:
    # JSON may carry lone surrogates (a \ud800 escape), which no UTF-8 encoder accepts later.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _error(UNICODE, f"is not valid Unicode: {exc.reason}") from None
    return value


Text = Annotated[str, AfterValidator(_unicode)]


@dataclass(frozen=True)
class OnlyDefault:
    """Type of a field for a feature this server lacks: null, or one of ``values`` (what asks
    for the default: ``n: 1``, ``tools: []``); else a 400 ``unsupported_parameter``."""

    values: tuple[Any, ...] = ()
    why: str = ""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"description": "not supported: only the default", "enum": [None, *self.values]}

    def _check(self, value: Any) -> Any:
        if value is None or any(_same_json(value, allowed) for allowed in self.values):
            return value
        accepted = " or ".join(repr(a) for a in (None, *self.values))
        raise unsupported(self.why or f"this server accepts only {accepted}")


def _same_json(value: Any, allowed: Any) -> bool:
    # JSON equality: 1.0 is 1, but true is not 1 (Python says True == 1).
    return bool(value == allowed) and isinstance(value, bool) == isinstance(allowed, bool)


@dataclass(frozen=True)
class Ignored:
    """Type of a field that asks for something this server does not do, where the reply
    without it is still a valid reply: any value is accepted, and one other than null or
    ``defaults`` is reported as ignored (``ignored_fields``)."""

    defaults: tuple[Any, ...] = ()

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.any_schema()

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"description": "accepted and ignored (reported in X-TinyServe-Ignored)"}

    def reports(self, value: Any) -> bool:
        return value is not None and not any(_same_json(value, d) for d in self.defaults)


class IgnoredItem(Body):
    """An object of a list whose ``type`` this server does not serve (a server tool, an image
    block, a reasoning item of another vendor): kept out of the request, reported as ignored."""

    type: Text


OTHER = "(other)"  # the tag of an ``IgnoredItem`` in a union told apart by ``type``


def open_by_type(phrase: str, *known: str, missing: str | None = None) -> Discriminator:
    """Tells the objects of a union apart by their ``type``: one of ``known`` (tagged by it, in
    parentheses) or any other (``OTHER``: an ``IgnoredItem``); an object without one is of the
    ``missing`` type where there is one, else, as anything but an object, a 400 "must be
    ``phrase``"."""
    tags = {kind: f"({kind})" for kind in known}

    def kind_of(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if kind is None and isinstance(value, dict | BaseModel):
            kind = missing
        return tags.get(kind, OTHER) if isinstance(kind, str) else None

    return Discriminator(kind_of, custom_error_type=RULE, custom_error_message=f"must be {phrase}")


def ignored_fields(body: BaseModel) -> list[str]:
    """Where ``body`` holds what was ignored: unknown fields, ``Ignored`` fields set to other
    than their default, ``IgnoredItem``s (with their type), as paths in the body."""
    found: list[str] = []
    _walk(body, "", found)
    return found


def _walk(value: Any, path: str, found: list[str]) -> None:
    if isinstance(value, IgnoredItem):
        found.append(f"{path}({value.type})")
    elif isinstance(value, BaseModel):
        for name, info in type(value).model_fields.items():
            where = f"{path}.{info.alias or name}" if path else info.alias or name
            sub = getattr(value, name)
            marks = [m for m in info.metadata if isinstance(m, Ignored)]
            if marks:
                if marks[0].reports(sub):
                    found.append(where)
            elif isinstance(sub, BaseModel | list):
                _walk(sub, where, found)
        found += [f"{path}.{key}" if path else key for key in value.model_extra or ()]
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, BaseModel):
                _walk(item, f"{path}[{i}]", found)


def schema_rule(
    field: str, value: Any, then: dict[str, Any], required: bool = True
) -> dict[str, Any]:
    """JSON Schema of a rule across fields: when ``field`` matches ``value``, each field of
    ``then`` matches its schema (and, with ``required``, is there)."""
    return {
        "if": {"properties": {field: value}, "required": [field]},
        "then": {"properties": then, "required": list(then) if required else []},
    }
