"""Delta table schemas: the JSON ``schemaString`` of a ``metaData`` action as typed Python objects.

The engine needs types for two jobs: turning the strings a log stores for partition values and file
statistics into comparable values, and checking that a user's predicate names real columns with
literals of the right type. Column mapping (``name``/``id`` mode) stores partition values and stats
under *physical* names, so each field keeps its physical name next to its logical one.
"""

from __future__ import annotations

import functools
import json
import reprlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import LogCorruptError

PRIMITIVE_TYPES = frozenset(
    {
        "string",
        "long",
        "integer",
        "short",
        "byte",
        "float",
        "double",
        "boolean",
        "binary",
        "date",
        "timestamp",
        "timestamp_ntz",
        "variant",
    }
)
INTEGRAL_TYPES = frozenset({"long", "integer", "short", "byte"})

COLUMN_MAPPING_PHYSICAL_NAME = "delta.columnMapping.physicalName"
#: Deepest type nesting accepted in a schema; deeper is taken as corruption (and would exhaust the stack).
MAX_SCHEMA_DEPTH = 100
MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class PrimitiveType:
    """A scalar Delta type such as ``long`` or ``date``."""

    name: str

    def simple_string(self) -> str:
        return self.name


@dataclass(frozen=True)
class DecimalType:
    """``decimal(precision, scale)``."""

    precision: int
    scale: int

    @property
    def name(self) -> str:
        return "decimal"

    def simple_string(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True)
class ArrayType:
    element_type: DataType
    contains_null: bool

    @property
    def name(self) -> str:
        return "array"

    def simple_string(self) -> str:
        return f"array<{self.element_type.simple_string()}>"


@dataclass(frozen=True)
class MapType:
    key_type: DataType
    value_type: DataType
    value_contains_null: bool

    @property
    def name(self) -> str:
        return "map"

    def simple_string(self) -> str:
        return f"map<{self.key_type.simple_string()},{self.value_type.simple_string()}>"


@dataclass(frozen=True)
class StructField:
    """One column. ``physical_name`` is where partition values and stats live under column mapping."""

    name: str
    type: DataType
    nullable: bool = True
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def physical_name(self) -> str:
        value = self.metadata.get(COLUMN_MAPPING_PHYSICAL_NAME)
        return value if isinstance(value, str) else self.name


@dataclass(frozen=True)
class StructType:
    fields: tuple[StructField, ...]

    @property
    def name(self) -> str:
        return "struct"

    def simple_string(self) -> str:
        inner = ",".join(f"{f.name}:{f.type.simple_string()}" for f in self.fields)
        return f"struct<{inner}>"

    def __iter__(self) -> Iterator[StructField]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    @property
    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def find(self, name: str) -> StructField | None:
        """Resolve a top-level column the way Spark does by default: case-insensitively."""
        for f in self.fields:
            if f.name == name:
                return f
        lowered = name.lower()
        for f in self.fields:
            if f.name.lower() == lowered:
                return f
        return None


DataType = PrimitiveType | DecimalType | ArrayType | MapType | StructType


@functools.lru_cache(maxsize=64)
def parse_schema(schema_string: str) -> StructType:
    """Parse a ``metaData.schemaString``; a malformed schema is a corrupt log, not a user error.

    Cached (types are immutable): a lease store decodes many requests planned on one table, each with a
    copy of its schema.
    """
    try:
        raw = json.loads(schema_string)
    except RecursionError as exc:
        raise LogCorruptError("schemaString is nested too deeply to decode") from exc
    except (TypeError, ValueError) as exc:
        raise LogCorruptError(f"schemaString is not valid JSON: {exc}") from exc
    parsed = _parse_type(raw, 0)
    if not isinstance(parsed, StructType):
        raise LogCorruptError(f"schemaString must describe a struct, got {parsed.simple_string()}")
    return parsed


def data_type_from_json(raw: Any) -> DataType:
    """A type in the JSON form of a schema string (``"long"``, ``{"type": "array", ...}``).

    Raises:
        LogCorruptError: ``raw`` is not a type the engine knows (callers outside the log re-raise it
            as their own error).
    """
    return _parse_type(raw, 0)


def data_type_to_json(data_type: DataType) -> str | dict[str, Any]:
    """The JSON form a ``schemaString`` uses for ``data_type``; ``data_type_from_json`` reads it back."""
    if isinstance(data_type, PrimitiveType | DecimalType):
        return data_type.simple_string()
    if isinstance(data_type, ArrayType):
        return {"type": "array", "elementType": data_type_to_json(data_type.element_type),
                "containsNull": data_type.contains_null}
    if isinstance(data_type, MapType):
        return {"type": "map", "keyType": data_type_to_json(data_type.key_type),
                "valueType": data_type_to_json(data_type.value_type),
                "valueContainsNull": data_type.value_contains_null}
    return {"type": "struct", "fields": [
        {"name": f.name, "type": data_type_to_json(f.type), "nullable": f.nullable, "metadata": dict(f.metadata)}
        for f in data_type.fields]}


def _parse_type(raw: Any, depth: int) -> DataType:
    if depth > MAX_SCHEMA_DEPTH:
        raise LogCorruptError(f"schema nests types more than {MAX_SCHEMA_DEPTH} levels deep")
    if isinstance(raw, str):
        if raw in PRIMITIVE_TYPES:
            return PrimitiveType(raw)
        if raw.startswith("decimal"):
            return _parse_decimal(raw)
        raise LogCorruptError(f"unknown data type {reprlib.repr(raw)} in schema")
    if not isinstance(raw, dict):
        raise LogCorruptError(f"malformed type in schema: {reprlib.repr(raw)}")
    kind = raw.get("type")
    if kind == "struct":
        fields = raw.get("fields")
        if not isinstance(fields, list):
            raise LogCorruptError("struct type without a fields list in schema")
        return StructType(tuple(_parse_field(f, depth + 1) for f in fields))
    if kind == "array":
        return ArrayType(_parse_type(raw.get("elementType"), depth + 1), _flag(raw, "containsNull"))
    if kind == "map":
        return MapType(
            _parse_type(raw.get("keyType"), depth + 1),
            _parse_type(raw.get("valueType"), depth + 1),
            _flag(raw, "valueContainsNull"),
        )
    raise LogCorruptError(f"unknown complex type {reprlib.repr(kind)} in schema")


def _flag(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, True)
    if not isinstance(value, bool):
        raise LogCorruptError(f"{key!r} in schema must be a boolean, got {reprlib.repr(value)}")
    return value


def _parse_field(raw: Any, depth: int) -> StructField:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise LogCorruptError(f"malformed struct field in schema: {reprlib.repr(raw)}")
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise LogCorruptError(f"field {raw['name']!r} has non-object metadata")
    return StructField(raw["name"], _parse_type(raw.get("type"), depth), _flag(raw, "nullable"), metadata)


def _parse_decimal(text: str) -> DecimalType:
    if text == "decimal":
        return DecimalType(10, 0)
    inner = text[len("decimal") :].strip()
    try:
        if not (inner.startswith("(") and inner.endswith(")")):
            raise ValueError(text)
        precision, scale = (int(part) for part in inner[1:-1].split(","))
    except ValueError as exc:
        raise LogCorruptError(f"malformed decimal type {reprlib.repr(text)} in schema") from exc
    if not (1 <= precision <= MAX_DECIMAL_PRECISION and 0 <= scale <= precision):
        raise LogCorruptError(f"decimal type {reprlib.repr(text)} in schema is out of range "
                              f"(precision 1..{MAX_DECIMAL_PRECISION}, 0 <= scale <= precision)")
    return DecimalType(precision, scale)
