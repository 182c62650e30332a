"""A JSON schema as a GBNF grammar whose every sentence is a JSON value the schema accepts.

Our own converter rather than llama-cpp-python's ``json_schema_to_gbnf``: that one drops
keywords it does not know without a word (``minimum``/``maximum`` among them), so a 200 could
carry a number the schema forbids; here a keyword that is not enforced is a ``SchemaError``
naming it (the frontend's 400). Whitespace is at most one space between tokens: a small model
given unbounded whitespace may emit newlines until ``max_tokens``.

Supported: ``type`` (one or a list), ``object`` (``properties``, ``required``,
``additionalProperties: false`` or absent; properties come out in declared order, required
before optional; without ``properties``, ``additionalProperties`` may be a schema that every
member's value follows), ``array`` (``items``, ``minItems``, ``maxItems``, ``prefixItems``),
``string`` (``minLength``, ``maxLength``), ``integer`` (bounds, exclusive too), ``number``
(whole-number ``minimum``/``maximum``), ``boolean``, ``null``, ``enum``, ``const``,
``anyOf``/``oneOf`` (as alternatives), ``allOf`` of one schema, and ``$ref`` into ``$defs`` or
``definitions``. Annotations (``title``, ``description``, ``default``...) are ignored.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tinyserve.frontend.structured.number_ranges import int_range, number_range

ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment",
     "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict"}
)  # fmt: skip
_BY_TYPE = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems", "prefixItems"},
    "string": {"minLength", "maxLength"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum"},
    "boolean": set(),
    "null": set(),
}
_GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}
MAX_RULES = 2000  # a schema that needs more is refused rather than built

PRIMITIVES = r"""
ws ::= " "?
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= "-"? ([0-9] | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
"""
ANY_JSON_OBJECT = "root ::= object\n" + PRIMITIVES


class SchemaError(ValueError):
    """A schema this converter cannot enforce; ``path`` is where in the schema (JSON pointer)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{problem} (at {path or '/'})")
        self.path = path


def schema_to_grammar(schema: Any) -> str:
    """The GBNF grammar (root rule ``root``) of the JSON values ``schema`` accepts."""
    root, rules = schema_rules(schema)
    return "\n".join([f"root ::= {root}", *rules]) + "\n" + PRIMITIVES


def schema_rules(schema: Any, prefix: str = "r") -> tuple[str, list[str]]:
    """An expression for the values ``schema`` accepts and the rules it uses (named
    ``prefix`` + a number, so several schemas can share one grammar with ``PRIMITIVES``)."""
    converter = _Converter(schema, prefix)
    return converter.visit(schema, ""), converter.rules


def _literal(value: Any) -> str:
    """A GBNF string literal for the JSON text of ``value``."""
    return json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False)


class _Converter:
    def __init__(self, schema: Any, prefix: str) -> None:
        self.document = schema
        self.prefix = prefix
        self.rules: list[str] = []
        self._refs: dict[str, str] = {}

    def rule(self, body: str) -> str:
        if len(self.rules) >= MAX_RULES:
            raise SchemaError("", f"the schema needs more than {MAX_RULES} grammar rules")
        name = f"{self.prefix}{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def visit(self, schema: Any, path: str) -> str:
        """An expression matching what ``schema`` accepts."""
        if schema is True or schema == {}:
            return "value"
        if not isinstance(schema, dict):
            raise SchemaError(path, "a schema must be an object")
        self._check_keywords(schema, path)
        if "$ref" in schema:
            return self._ref(schema["$ref"], path)
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return self._enum(schema["enum"], path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self._union(schema[key], f"{path}/{key}")
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise SchemaError(f"{path}/allOf", "'allOf' is supported with one schema only")
            return self.visit(parts[0], f"{path}/allOf/0")
        kind = schema.get("type")
        if isinstance(kind, list):
            options = [self._typed(dict(schema, type=k), k, path) for k in kind]
            return "(" + " | ".join(options) + ")"
        if kind is None:
            return self._untyped(schema, path)
        return self._typed(schema, kind, path)

    def _untyped(self, schema: dict[str, Any], path: str) -> str:
        """No ``type``: any value, unless its keywords belong to one type (then that type)."""
        specific = set(schema) - ANNOTATIONS - _GENERAL
        if not specific:
            return "value"
        for kind in ("object", "array", "string", "number"):
            if specific <= _BY_TYPE[kind]:
                return self._typed(schema, kind, path)
        raise SchemaError(path, f"keywords of different types without a 'type': {sorted(specific)}")

    def _check_keywords(self, schema: dict[str, Any], path: str) -> None:
        kinds = schema.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds] if kinds else list(_BY_TYPE)
        allowed = set(ANNOTATIONS) | _GENERAL
        for kind in kinds:
            if kind not in _BY_TYPE:
                raise SchemaError(f"{path}/type", f"unknown type {kind!r}")
            allowed |= _BY_TYPE[kind]
        unknown = sorted(set(schema) - allowed)
        if unknown:
            raise SchemaError(path, f"unsupported schema keyword {unknown[0]!r}")

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref):
            raise SchemaError(f"{path}/$ref", "only '#/$defs/NAME' or '#/definitions/NAME' refs")
        if ref not in self._refs:
            section, name = ref[2:].split("/")
            target = (
                self.document.get(section, {}).get(name)
                if isinstance(self.document, dict)
                else None
            )
            if target is None:
                raise SchemaError(f"{path}/$ref", f"{ref} is not defined")
            # The name first: a recursive schema refers to itself through it.
            index = len(self.rules)
            self._refs[ref] = rule = f"{self.prefix}{index}"
            self.rules.append("")
            body = self.visit(target, ref[1:])
            self.rules[index] = f"{rule} ::= {body}"
        return self._refs[ref]

    def _enum(self, values: Any, path: str) -> str:
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{path}/enum", "'enum' must be a non-empty list")
        return "(" + " | ".join(_literal(v) for v in values) + ")"

    def _union(self, options: Any, path: str) -> str:
        if not isinstance(options, list) or not options:
            raise SchemaError(path, "must be a non-empty list of schemas")
        return "(" + " | ".join(self.visit(o, f"{path}/{i}") for i, o in enumerate(options)) + ")"

    def _typed(self, schema: dict[str, Any], kind: str, path: str) -> str:
        if kind == "object":
            return self._object(schema, path)
        if kind == "array":
            return self._array(schema, path)
        if kind == "string":
            return self._string(schema, path)
        if kind in ("integer", "number"):
            return _bounded_number(schema, kind, path)
        return kind  # boolean, null

    def _object(self, schema: dict[str, Any], path: str) -> str:
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        if not properties and not schema.get("required"):
            if isinstance(extra, dict) and extra:
                return self._map(extra, f"{path}/additionalProperties")
            if "properties" not in schema and extra is not False:
                return "object"  # any object: nothing said about its members
        if extra not in (False, None):
            raise SchemaError(
                f"{path}/additionalProperties", "only false, or a schema without 'properties'"
            )
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(path, "'properties' must be an object and 'required' a list")
        missing = [name for name in required if name not in properties]
        if missing:
            raise SchemaError(f"{path}/required", f"{missing[0]!r} has no schema in 'properties'")
        pairs = {
            name: f'{_literal(name)} ws ":" ws {self.visit(sub, f"{path}/properties/{name}")} ws'
            for name, sub in properties.items()
        }
        needed = [pairs[n] for n in properties if n in required]
        optional = [pairs[n] for n in properties if n not in required]
        return self.rule(f'"{{" ws {_members(needed, optional)} "}}"')

    def _map(self, values: dict[str, Any], path: str) -> str:
        """An object of any members, each value one ``values`` accepts."""
        member = f'string ws ":" ws {self.visit(values, path)} ws'
        return self.rule(f'"{{" ws ({member} ("," ws {member})*)? "}}"')

    def _array(self, schema: dict[str, Any], path: str) -> str:
        if "prefixItems" in schema:
            items = [
                self.visit(s, f"{path}/prefixItems/{i}")
                for i, s in enumerate(schema["prefixItems"])
            ]
            return self.rule('"[" ws ' + ' "," ws '.join(f"{i} ws" for i in items) + ' "]"')
        item = self.visit(schema.get("items", True), f"{path}/items")
        low, high = _length_bounds(schema, "minItems", "maxItems", path)
        one = f"{item} ws"
        if high == 0:
            return '"[" ws "]"'
        more = f'("," ws {one})' + _repeat(max(low - 1, 0), None if high is None else high - 1)
        body = f"{one} {more}"
        return self.rule(f'"[" ws {body if low else f"({body})?"} "]"')

    def _string(self, schema: dict[str, Any], path: str) -> str:
        low, high = _length_bounds(schema, "minLength", "maxLength", path)
        if low == 0 and high is None:
            return "string"
        return self.rule(f'"\\"" char{_repeat(low, high)} "\\""')


def _members(needed: list[str], optional: list[str]) -> str:
    """Object members: every needed one in order, then any of the optional ones in order."""
    if needed:
        return ' "," ws '.join(needed) + "".join(f' ("," ws {p})?' for p in optional)
    if not optional:
        return ""
    chains = [
        p + "".join(f' ("," ws {q})?' for q in optional[i + 1 :]) for i, p in enumerate(optional)
    ]
    return "(" + " | ".join(chains) + ")?"


def _repeat(low: int, high: int | None) -> str:
    return f"{{{low},}}" if high is None else f"{{{low},{high}}}"


def _length_bounds(
    schema: dict[str, Any], low_key: str, high_key: str, path: str
) -> tuple[int, int | None]:
    low, high = schema.get(low_key, 0), schema.get(high_key)
    for key, value in ((low_key, low), (high_key, high)):
        if value is not None and (type(value) is not int or value < 0):
            raise SchemaError(f"{path}/{key}", "must be an integer >= 0")
    if high is not None and high < low:
        raise SchemaError(f"{path}/{high_key}", f"is less than {low_key}")
    return low, high


def _bounded_number(schema: dict[str, Any], kind: str, path: str) -> str:
    low, high = _whole_bound(schema, "minimum", path), _whole_bound(schema, "maximum", path)
    if kind == "integer":
        strict_low = _whole_bound(schema, "exclusiveMinimum", path)
        strict_high = _whole_bound(schema, "exclusiveMaximum", path)
        if strict_low is not None:
            low = strict_low + 1 if low is None else max(low, strict_low + 1)
        if strict_high is not None:
            high = strict_high - 1 if high is None else min(high, strict_high - 1)
    if low is not None and high is not None and low > high:
        raise SchemaError(path, "no number lies between its bounds")
    if low is None and high is None:
        return kind
    if kind == "integer":
        return "(" + int_range(low, high) + ")"
    return "(" + number_range(low, high) + ")"


def _whole_bound(schema: dict[str, Any], key: str, path: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or value != int(value):
        raise SchemaError(f"{path}/{key}", "only whole-number bounds are supported")
    return int(value)
