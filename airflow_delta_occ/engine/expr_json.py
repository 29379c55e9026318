"""Predicate expressions as plain JSON, so a job spec, a pool lease or a trigger can carry them.

Every node is an object with a ``kind``; every literal value names its Python type, so ``"1"``,
``1`` and ``Decimal("1")`` stay apart and numbers keep every digit in any JSON reader::

    {"kind": "and", "args": [
        {"kind": "comparison", "op": "=", "left": {"kind": "column", "name": "date", "qualifier": null},
         "right": {"kind": "literal", "value": {"date": "2024-01-01"}, "type": "date"}},
        {"kind": "in", "value": {"kind": "column", "name": "country", "qualifier": null},
         "options": [{"kind": "literal", "value": {"str": "DE"}, "type": null}], "negated": false}]}

Kinds: ``column`` (name, qualifier), ``literal`` (value, type), ``comparison`` (op, left, right),
``in`` (value, options, negated), ``is_null`` (value, negated), ``and`` / ``or`` (args), ``not``
(child), ``unknown`` (text, deterministic). Value tags: ``null``, ``bool``, ``str``, ``int``,
``float``, ``decimal``, ``date``, ``datetime``, ``bytes``; numbers, dates and times are their
canonical strings (``repr`` of a float, so ``"nan"`` and ``"-inf"`` too), bytes are lowercase hex.
A literal's ``type`` is the JSON a Delta ``schemaString`` uses for that type.

A chain of ANDs (or ORs) is one node with a list of ``args``, folded back left-deep: that is how
the parser and ``and_`` build conjunctions, and it keeps the document shallow however long the
chain, so neither ``json`` nor these functions recurse on it. Both walk the tree with an explicit
stack.

Decoding treats the document as untrusted. Whatever it holds, the result is an expression or an
``ExpressionDecodeError`` naming the place (``$.args[1].right``): nesting beyond ``MAX_JSON_DEPTH``
or more than ``MAX_NODES`` nodes, unknown kinds or tags, wrong JSON types, non-canonical numbers,
a value that does not fit its literal's type, and ``unknown`` text that is not a self-contained
piece of SQL (``to_sql`` writes that text into statements in parentheses, so a text that closes
them could smuggle in a condition).
"""

from __future__ import annotations

import datetime as dt
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Generic, TypeVar, get_args

from .actions import _type_name as _json_type
from .errors import ExpressionDecodeError, LogCorruptError, PredicateSyntaxError
from .expressions import And, Column, Comparison, ComparisonOp, Expr, In, IsNull, Literal, Not, Or, Unknown
from .schema import INTEGRAL_TYPES, DataType, data_type_from_json, data_type_to_json
from .sql_parser import MAX_DEPTH, MAX_LENGTH, tokenize

__all__ = ["MAX_JSON_DEPTH", "MAX_NODES", "expr_from_json", "expr_to_json"]

MAX_JSON_DEPTH = MAX_DEPTH
"""Deepest nesting of nodes in a document (an AND/OR chain counts once). The parser refuses trees
deeper than ``MAX_DEPTH``, so every expression it builds fits."""
MAX_NODES = MAX_LENGTH
"""Most nodes in a document: every node of a parsed expression costs at least one character of its
``MAX_LENGTH`` characters of text."""

_OPS: dict[str, ComparisonOp] = {op: op for op in get_args(ComparisonOp)}
_CLOSERS = {"lparen": "rparen", "lbracket": "rbracket"}

S = TypeVar("S")
R = TypeVar("R")


# -- the walk shared by both directions ------------------------------------------------------------

@dataclass(frozen=True)
class _Step(Generic[S, R]):
    """One node's children (each with its path) and how to assemble the node from their results."""

    children: Sequence[tuple[S, str]]
    assemble: Callable[[list[R]], R]


@dataclass(frozen=True)
class _Assemble(Generic[R]):
    make: Callable[[list[R]], R]
    count: int


def _fold(root: S, expand: Callable[[S, str], _Step[S, R]], refuse: Callable[[str, str], Exception]) -> R:
    """Post-order over a tree with an explicit stack: deep trees cost memory, never Python frames.

    ``refuse(problem, path)`` builds the error for a tree beyond ``MAX_JSON_DEPTH`` or ``MAX_NODES``.
    """
    results: list[R] = []
    todo: list[tuple[S, str, int] | _Assemble[R]] = [(root, "$", 1)]
    nodes = 0
    while todo:
        item = todo.pop()
        if isinstance(item, _Assemble):
            start = len(results) - item.count
            kids = results[start:]
            del results[start:]
            results.append(item.make(kids))
            continue
        node, path, depth = item
        nodes += 1
        if depth > MAX_JSON_DEPTH:
            raise refuse(f"nodes are nested more than {MAX_JSON_DEPTH} levels deep", path)
        if nodes > MAX_NODES:
            raise refuse(f"the expression has more than {MAX_NODES} nodes", path)
        step = expand(node, path)
        todo.append(_Assemble(step.assemble, len(step.children)))
        todo.extend((child, child_path, depth + 1) for child, child_path in reversed(step.children))
    return results[0]


def _leaf(result: R) -> _Step[Any, R]:
    return _Step((), lambda _: result)


# -- encoding --------------------------------------------------------------------------------------

def expr_to_json(expr: Expr) -> dict[str, Any]:
    """The JSON form of an expression: only dicts, lists, strings, booleans and ``None``.

    ``expr_from_json(json.loads(json.dumps(expr_to_json(e)))) == e`` for every expression the
    parser or ``bind`` produces.

    Raises:
        TypeError: a node is not an expression, or a literal holds a value outside the model.
        ValueError: the tree is beyond ``MAX_JSON_DEPTH`` / ``MAX_NODES`` (``expr_from_json`` would
            refuse the document), or a literal is a non-finite ``Decimal``.
    """
    return _fold(expr, _encode_step, lambda problem, _: ValueError(f"cannot encode the expression: {problem}"))


def _encode_step(expr: Expr, path: str) -> _Step[Expr, dict[str, Any]]:
    if isinstance(expr, Column):
        return _leaf({"kind": "column", "name": expr.name, "qualifier": expr.qualifier})
    if isinstance(expr, Literal):
        data_type = None if expr.type is None else data_type_to_json(expr.type)
        return _leaf({"kind": "literal", "value": _encode_value(expr.value, path), "type": data_type})
    if isinstance(expr, Unknown):
        return _leaf({"kind": "unknown", "text": expr.text, "deterministic": expr.deterministic})
    if isinstance(expr, Comparison):
        op = expr.op
        return _Step([(expr.left, f"{path}.left"), (expr.right, f"{path}.right")],
                     lambda kids: {"kind": "comparison", "op": op, "left": kids[0], "right": kids[1]})
    if isinstance(expr, In):
        negated = expr.negated
        options = [(o, f"{path}.options[{i}]") for i, o in enumerate(expr.options)]
        return _Step([(expr.value, f"{path}.value"), *options],
                     lambda kids: {"kind": "in", "value": kids[0], "options": kids[1:], "negated": negated})
    if isinstance(expr, IsNull):
        negated = expr.negated
        return _Step([(expr.value, f"{path}.value")],
                     lambda kids: {"kind": "is_null", "value": kids[0], "negated": negated})
    if isinstance(expr, And | Or):
        kind = "and" if isinstance(expr, And) else "or"
        args = [(arg, f"{path}.args[{i}]") for i, arg in enumerate(_chain(expr))]
        return _Step(args, lambda kids: {"kind": kind, "args": kids})
    if isinstance(expr, Not):
        return _Step([(expr.child, f"{path}.child")], lambda kids: {"kind": "not", "child": kids[0]})
    raise TypeError(f"not an expression at {path}: {type(expr).__name__}")


def _chain(expr: And | Or) -> list[Expr]:
    """The operands of a left-deep chain of one connective: ``And(And(a, b), c)`` gives ``[a, b, c]``."""
    connective = type(expr)
    rights: list[Expr] = []
    node: Expr = expr
    while isinstance(node, connective):
        rights.append(node.right)
        node = node.left
    return [node, *reversed(rights)]


def _encode_value(value: Any, path: str) -> dict[str, Any]:
    """A literal value as a one-key object whose key names its type."""
    if value is None:
        return {"null": None}
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": str(int(value))}
    if isinstance(value, float):
        return {"float": repr(float(value))}
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"literal at {path} is the non-finite decimal {value}")
        return {"decimal": str(value)}
    if isinstance(value, dt.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, str):
        return {"str": str(value)}
    raise TypeError(f"literal at {path} holds a {type(value).__name__}, which has no JSON form")


# -- decoding --------------------------------------------------------------------------------------

def expr_from_json(data: object) -> Expr:
    """Rebuild an expression from ``expr_to_json``'s form (as parsed by ``json.loads``).

    Raises:
        ExpressionDecodeError: the document does not describe an expression; ``path`` says where.
    """
    return _fold(data, _decode_step, lambda problem, path: ExpressionDecodeError(problem, path=path))


def _decode_step(raw: object, path: str) -> _Step[object, Expr]:
    node = _json_object(raw, "an expression node", path)
    kind = node.get("kind")
    decoder = _NODE_DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise ExpressionDecodeError(f"unknown node kind {reprlib.repr(kind)}; expected one of "
                                    f"{', '.join(_NODE_DECODERS)}", path=path)
    return decoder(node, path)


def _decode_column(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    return _leaf(Column(_str_field(node, "name", path), _opt_str_field(node, "qualifier", path)))


def _decode_literal(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    raw_type = node.get("type")
    data_type = None if raw_type is None else _decode_type(raw_type, f"{path}.type")
    value = _decode_value(_field(node, "value", path), f"{path}.value")
    _check_fits(value, data_type, path)
    return _leaf(Literal(value, data_type))


def _decode_unknown(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    text = _str_field(node, "text", path)
    _check_sql_fragment(text, f"{path}.text")
    return _leaf(Unknown(text, _bool_field(node, "deterministic", path, default=True)))


def _decode_comparison(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    raw_op = node.get("op")
    op = _OPS.get(raw_op) if isinstance(raw_op, str) else None
    if op is None:
        raise ExpressionDecodeError(f"unknown comparison operator {reprlib.repr(raw_op)}; expected one of "
                                    f"{', '.join(_OPS)}", path=f"{path}.op")
    children = [(_field(node, "left", path), f"{path}.left"), (_field(node, "right", path), f"{path}.right")]
    return _Step(children, lambda kids: Comparison(op, kids[0], kids[1]))


def _decode_in(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    negated = _bool_field(node, "negated", path, default=False)
    options = _list_field(node, "options", path, minimum=1)
    children = [(_field(node, "value", path), f"{path}.value"),
                *((o, f"{path}.options[{i}]") for i, o in enumerate(options))]
    return _Step(children, lambda kids: In(kids[0], tuple(kids[1:]), negated))


def _decode_is_null(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    negated = _bool_field(node, "negated", path, default=False)
    return _Step([(_field(node, "value", path), f"{path}.value")], lambda kids: IsNull(kids[0], negated))


def _decode_connective(connective: type[And] | type[Or]) -> Callable[[Mapping[str, object], str],
                                                                     _Step[object, Expr]]:
    def decode(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
        args = _list_field(node, "args", path, minimum=2)
        return _Step([(a, f"{path}.args[{i}]") for i, a in enumerate(args)], fold_left)

    def fold_left(kids: list[Expr]) -> Expr:
        result = kids[0]
        for kid in kids[1:]:
            result = connective(result, kid)
        return result

    return decode


def _decode_not(node: Mapping[str, object], path: str) -> _Step[object, Expr]:
    return _Step([(_field(node, "child", path), f"{path}.child")], lambda kids: Not(kids[0]))


_NODE_DECODERS: dict[str, Callable[[Mapping[str, object], str], _Step[object, Expr]]] = {
    "column": _decode_column,
    "literal": _decode_literal,
    "comparison": _decode_comparison,
    "in": _decode_in,
    "is_null": _decode_is_null,
    "and": _decode_connective(And),
    "or": _decode_connective(Or),
    "not": _decode_not,
    "unknown": _decode_unknown,
}


# -- fields ----------------------------------------------------------------------------------------

def _json_object(raw: object, what: str, path: str) -> Mapping[str, object]:
    if not isinstance(raw, dict):
        raise ExpressionDecodeError(f"{what} must be an object, got {_json_type(raw)}", path=path)
    return raw


def _field(node: Mapping[str, object], key: str, path: str) -> object:
    if key not in node:
        raise ExpressionDecodeError(f"required field {key!r} is missing", path=path)
    return node[key]


def _str_field(node: Mapping[str, object], key: str, path: str) -> str:
    value = _field(node, key, path)
    if not isinstance(value, str):
        raise ExpressionDecodeError(f"must be a string, got {_json_type(value)}", path=f"{path}.{key}")
    return value


def _opt_str_field(node: Mapping[str, object], key: str, path: str) -> str | None:
    return None if node.get(key) is None else _str_field(node, key, path)


def _bool_field(node: Mapping[str, object], key: str, path: str, *, default: bool) -> bool:
    value = node.get(key, default)
    if not isinstance(value, bool):
        raise ExpressionDecodeError(f"must be a boolean, got {_json_type(value)}", path=f"{path}.{key}")
    return value


def _list_field(node: Mapping[str, object], key: str, path: str, *, minimum: int) -> list[object]:
    value = _field(node, key, path)
    if not isinstance(value, list):
        raise ExpressionDecodeError(f"must be an array, got {_json_type(value)}", path=f"{path}.{key}")
    if len(value) < minimum:
        raise ExpressionDecodeError(f"needs at least {minimum} element(s), got {len(value)}", path=f"{path}.{key}")
    return value


def _decode_type(raw: object, path: str) -> DataType:
    try:
        return data_type_from_json(raw)
    except LogCorruptError as exc:
        raise ExpressionDecodeError(str(exc).replace(" in schema", ""), path=path) from None


# -- literal values ----------------------------------------------------------------------------------

V = TypeVar("V")


def _canonical(parse: Callable[[str], V], render: Callable[[V], str], what: str) -> Callable[[object, str], V]:
    """A decoder for a value written as a string, which must be exactly how ``render`` writes it.

    Accepting only the canonical string keeps one document per expression, and refuses what
    Python's lenient parsers would take (``int(" 1_0 ")``, ``Decimal("NaN")``, other digit scripts).
    """
    def decode(payload: object, path: str) -> V:
        if not isinstance(payload, str):
            raise ExpressionDecodeError(f"a {what} must be written as a string, got {_json_type(payload)}", path=path)
        try:
            value = parse(payload)
            canonical = render(value)
        except (ValueError, ArithmeticError):
            raise ExpressionDecodeError(f"{reprlib.repr(payload)} is not a {what}", path=path) from None
        if canonical != payload:
            raise ExpressionDecodeError(f"{reprlib.repr(payload)} is not a {what} in canonical form "
                                        f"({reprlib.repr(canonical)})", path=path)
        return value
    return decode


def _finite_decimal(text: str) -> Decimal:
    value = Decimal(text)
    if not value.is_finite():
        raise ValueError("decimal literals are finite")
    return value


def _float(text: str) -> float:
    value = float(text)
    return math.nan if math.isnan(value) else value  # the one NaN object, equal to itself in a Literal


def _bytes(text: str) -> bytes:
    if not text.isascii():  # bytes.fromhex rejects it anyway; say so before it does
        raise ValueError("not hexadecimal")
    return bytes.fromhex(text)


def _typed(kind: type[V], json_type: str) -> Callable[[object, str], V]:
    """A decoder for a value JSON holds as itself (``true``, ``"text"``)."""
    def decode(payload: object, path: str) -> V:
        if not isinstance(payload, kind):
            raise ExpressionDecodeError(f"must be {json_type}, got {_json_type(payload)}", path=path)
        return payload
    return decode


def _null(payload: object, path: str) -> None:
    if payload is not None:
        raise ExpressionDecodeError(f"a null literal must be written as {{\"null\": null}}, got "
                                    f"{_json_type(payload)}", path=path)


_VALUE_DECODERS: dict[str, Callable[[object, str], Any]] = {
    "null": _null,
    "bool": _typed(bool, "a boolean"),
    "str": _typed(str, "a string"),
    "int": _canonical(int, str, "whole number"),
    "float": _canonical(_float, repr, "floating-point number"),
    "decimal": _canonical(_finite_decimal, str, "finite decimal number"),
    "date": _canonical(dt.date.fromisoformat, dt.date.isoformat, "date (YYYY-MM-DD)"),
    "datetime": _canonical(dt.datetime.fromisoformat, dt.datetime.isoformat, "ISO 8601 date and time"),
    "bytes": _canonical(_bytes, bytes.hex, "lowercase hexadecimal byte string"),
}


def _decode_value(raw: object, path: str) -> Any:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ExpressionDecodeError(f"a literal value must be an object with one key naming its type, such as "
                                    f"{{\"int\": \"1\"}}; got {_json_type(raw)}"
                                    + (f" with {len(raw)} keys" if isinstance(raw, dict) else ""), path=path)
    ((tag, payload),) = raw.items()
    decoder = _VALUE_DECODERS.get(tag) if isinstance(tag, str) else None
    if decoder is None:
        raise ExpressionDecodeError(f"unknown value type {reprlib.repr(tag)}; expected one of "
                                    f"{', '.join(_VALUE_DECODERS)}", path=path)
    return decoder(payload, f"{path}.{tag}")


def _is_date(value: object) -> bool:
    return isinstance(value, dt.date) and not isinstance(value, dt.datetime)


def _is_timestamp(value: object, *, aware: bool) -> bool:
    return isinstance(value, dt.datetime) and (value.tzinfo is not None) is aware


_FITS: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    **{name: (lambda v: isinstance(v, int) and not isinstance(v, bool)) for name in INTEGRAL_TYPES},
    "float": lambda v: isinstance(v, float),
    "double": lambda v: isinstance(v, float),
    "decimal": lambda v: isinstance(v, Decimal),
    "boolean": lambda v: isinstance(v, bool),
    "date": _is_date,
    "timestamp": lambda v: _is_timestamp(v, aware=True),
    "timestamp_ntz": lambda v: _is_timestamp(v, aware=False),
    "binary": lambda v: isinstance(v, bytes),
}


def _check_fits(value: object, data_type: DataType | None, path: str) -> None:
    """A typed literal holds a value of its type, as the parser and ``bind`` make them.

    Evaluation compares literal values with column values of that type; a ``str`` posing as a
    ``date`` would only fail later, far from the document that carried it.
    """
    if value is None or data_type is None:
        return
    fits = _FITS.get(data_type.name)
    if fits is None or not fits(value):
        raise ExpressionDecodeError(f"a {type(value).__name__} value does not fit the literal's type "
                                    f"{data_type.simple_string()}", path=path)


def _check_sql_fragment(text: str, path: str) -> None:
    """``unknown`` text must be tokens Spark's lexer accepts, with brackets balanced inside it.

    ``to_sql`` writes the text as ``(text)``: balanced, it cannot close that parenthesis and add a
    condition of its own, nor hide a comment or a second statement.
    """
    try:
        tokens = tokenize(text)
    except PredicateSyntaxError as exc:
        reason = str(exc).split(" at position ", 1)[0]
        raise ExpressionDecodeError(f"unknown expression text is not valid SQL: {reason}", path=path) from None
    if len(tokens) == 1:
        raise ExpressionDecodeError("unknown expression text is empty", path=path)
    open_brackets: list[str] = []
    for token in tokens:
        if token.kind in _CLOSERS:
            open_brackets.append(_CLOSERS[token.kind])
        elif token.kind in ("rparen", "rbracket") and (not open_brackets or open_brackets.pop() != token.kind):
            raise ExpressionDecodeError(f"unknown expression text closes a bracket it did not open (position "
                                        f"{token.start})", path=path)
    if open_brackets:
        raise ExpressionDecodeError("unknown expression text leaves a bracket open", path=path)
