"""A JSON schema as a GBNF grammar whose every sentence is a JSON value the schema accepts.

Our own converter rather than llama-cpp-python's ``json_schema_to_gbnf``: that one drops
keywords it does not know without a word (``minimum``/``maximum`` among them). Here a keyword
the grammar cannot enforce (``format``, ``pattern``, fractional bounds, ``not``...) constrains
nothing and is listed in ``Grammar.unenforced``, by its place in the schema, for the caller to
report; a schema that is not one (not an object, a ``$ref`` to nothing, an ``enum`` that is no
list) is a ``SchemaError`` (the frontend's 400). Whitespace is at most one space between
tokens: a small model given unbounded whitespace may emit newlines until ``max_tokens``.

Supported: ``type`` (one or a list), ``object`` (``properties``, ``required``,
``additionalProperties: false`` or absent; properties come out in declared order, required
before optional; without ``properties``, ``additionalProperties`` may be a schema that every
member's value follows), ``array`` (``items``, ``minItems``, ``maxItems``, ``prefixItems``),
``string`` (``minLength``, ``maxLength``), ``integer`` (bounds, exclusive too), ``number``
(whole-number ``minimum``/``maximum``), ``boolean``, ``null``, ``enum``, ``const``,
``anyOf``/``oneOf`` (as alternatives), ``allOf`` (its first schema), and ``$ref`` into
``$defs`` or ``definitions``. Annotations (``title``, ``description``, ``default``...) are
ignored. ``additionalProperties`` other than false beside ``properties`` is enforced as false
(the members the schema names, which it accepts).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
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
_TYPED = set().union(*_BY_TYPE.values())
MAX_RULES = 2000  # a schema that needs more is refused rather than built
MAX_DEPTH = 128  # path segments: deeper is refused before Python's recursion limit is met

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


@dataclass(frozen=True)
class Grammar:
    """What a schema became: an expression for the values it accepts, the rules it uses, and
    the keywords it holds that the grammar does not enforce (``path: keyword``)."""

    root: str
    rules: list[str]
    unenforced: list[str]


def schema_to_grammar(schema: Any) -> tuple[str, list[str]]:
    """The GBNF grammar (root rule ``root``) of the JSON values ``schema`` accepts, and what of
    the schema it does not enforce."""
    grammar = schema_rules(schema)
    text = "\n".join([f"root ::= {grammar.root}", *grammar.rules]) + "\n" + PRIMITIVES
    return text, grammar.unenforced


def schema_rules(schema: Any, prefix: str = "r") -> Grammar:
    """``schema`` as a grammar expression with its rules (named ``prefix`` + a number, so
    several schemas can share one grammar with ``PRIMITIVES``)."""
    converter = _Converter(schema, prefix)
    root = converter.visit(schema, "")
    return Grammar(root, converter.rules, converter.unenforced)


def _literal(value: Any) -> str:
    """A GBNF string literal for the JSON text of ``value``."""
    return json.dumps(json.dumps(value, ensure_ascii=False), ensure_ascii=False)


class _Converter:
    def __init__(self, schema: Any, prefix: str) -> None:
        self.document = schema
        self.prefix = prefix
        self.rules: list[str] = []
        self.unenforced: list[str] = []
        self._refs: dict[str, str] = {}

    def skip(self, path: str, keyword: str) -> None:
        """``keyword`` at ``path`` constrains nothing here."""
        self.unenforced.append(f"{path or '/'}: {keyword}")

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
        if path.count("/") > MAX_DEPTH:
            raise SchemaError(path, f"the schema is nested more than {MAX_DEPTH} levels deep")
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
            if not isinstance(parts, list) or not parts:
                raise SchemaError(f"{path}/allOf", "must be a non-empty list of schemas")
            for i in range(1, len(parts)):
                self.skip(f"{path}/allOf/{i}", "allOf")
            return self.visit(parts[0], f"{path}/allOf/0")
        kind = schema.get("type")
        if isinstance(kind, list):
            kinds = [k for k in kind if isinstance(k, str) and k in _BY_TYPE]
            if not kinds:
                return "value"
            options = [self._typed(dict(schema, type=k), k, path) for k in kinds]
            return "(" + " | ".join(options) + ")"
        if kind is None:
            return self._untyped(schema, path)
        if not (isinstance(kind, str) and kind in _BY_TYPE):
            return "value"
        return self._typed(schema, kind, path)

    def _untyped(self, schema: dict[str, Any], path: str) -> str:
        """No ``type``: any value, unless its keywords belong to one type (then that type)."""
        specific = set(schema) & _TYPED
        if not specific:
            return "value"
        for kind in ("object", "array", "string", "number"):
            if specific <= _BY_TYPE[kind]:
                return self._typed(schema, kind, path)
        self.skip(path, "keywords of several types without a 'type'")
        return "value"

    def _check_keywords(self, schema: dict[str, Any], path: str) -> None:
        """Every keyword of ``schema`` this converter does not enforce is listed (a ``type``
        that names no JSON type among them: the value is then any)."""
        kinds = schema.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []
        allowed = set(ANNOTATIONS) | _GENERAL
        for kind in kinds:
            if isinstance(kind, str) and kind in _BY_TYPE:
                allowed |= _BY_TYPE[kind]
            else:
                self.skip(f"{path}/type", f"type {json.dumps(kind)[:40]}")
        if not kinds:
            allowed |= _TYPED
        for keyword in sorted(set(schema) - allowed):
            if keyword not in _TYPED:  # another type's keyword constrains nothing here
                self.skip(path, keyword)

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str) or not re.fullmatch(r"#/(\$defs|definitions)/[^/]+", ref):
            self.skip(path, "$ref")  # the root, another document: not followed
            return "value"
        if ref not in self._refs:
            section, name = ref[2:].split("/")
            defs = self.document.get(section) if isinstance(self.document, dict) else None
            target = defs.get(name) if isinstance(defs, dict) else None
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
            return self._bounded_number(schema, kind, path)
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
            self.skip(path, "additionalProperties")
        required = schema.get("required", [])
        if not isinstance(properties, dict) or not isinstance(required, list):
            raise SchemaError(path, "'properties' must be an object and 'required' a list")
        if not all(isinstance(name, str) for name in required):
            raise SchemaError(f"{path}/required", "must be a list of property names")
        properties = dict(properties)
        for name in required:
            if name not in properties:  # required, of any value
                properties[name] = True
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
            if not isinstance(schema["prefixItems"], list):
                raise SchemaError(f"{path}/prefixItems", "must be a list of schemas")
            items = [
                self.visit(s, f"{path}/prefixItems/{i}")
                for i, s in enumerate(schema["prefixItems"])
            ]
            return self.rule('"[" ws ' + ' "," ws '.join(f"{i} ws" for i in items) + ' "]"')
        items = schema.get("items", True)
        if isinstance(items, list):  # the older form of prefixItems
            return self._array({**schema, "prefixItems": items, "items": True}, path)
        item = self.visit(items, f"{path}/items")
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

    def _bounded_number(self, schema: dict[str, Any], kind: str, path: str) -> str:
        low, high = (
            self._whole_bound(schema, "minimum", path),
            self._whole_bound(schema, "maximum", path),
        )
        if kind == "integer":
            strict_low = self._whole_bound(schema, "exclusiveMinimum", path)
            strict_high = self._whole_bound(schema, "exclusiveMaximum", path)
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

    def _whole_bound(self, schema: dict[str, Any], key: str, path: str) -> int | None:
        """A bound the grammar enforces: a whole number (others are listed, not enforced)."""
        value = schema.get(key)
        if value is None:
            return None
        if type(value) not in (int, float) or not math.isfinite(value) or value != int(value):
            self.skip(path, key)
            return None
        return int(value)


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
    low, high = schema.get(low_key), schema.get(high_key)
    for key, value in ((low_key, low), (high_key, high)):
        if value is not None and (type(value) is not int or value < 0):
            raise SchemaError(f"{path}/{key}", "must be an integer >= 0")
    low = low or 0  # null: no bound
    if high is not None and high < low:
        raise SchemaError(f"{path}/{high_key}", f"is less than {low_key}")
    return low, high
