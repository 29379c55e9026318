"""Parser and renderer for the SQL expressions the provider accepts from a DAG.

Hand-written (tokenizer + recursive descent over Spark's expression precedence) for two jobs:

* the engine evaluates what it models (columns, typed literals, comparisons, IN, IS NULL,
  AND/OR/NOT); every other construct Spark accepts in a condition (function calls, arithmetic,
  CASE, CAST, LIKE, intervals, subscripts) becomes an ``Unknown`` node, which the file-set
  computation treats as "any value on any row";
* the provider never hands a DAG's text to Spark. It parses the text completely and renders the
  statement back from the tree (``to_sql``): identifiers re-quoted, literals re-escaped, every
  compound node in its own parentheses. So the parentheses, quotes and keywords Spark sees are the
  provider's own, and an injected partition predicate stays a top-level conjunct whatever the text
  was. An ``Unknown`` node's text is that canonical rendering too, never a slice of the input.

Text outside the grammar is refused with ``PredicateSyntaxError`` naming the position: comments and
``;`` (the usual way to smuggle a second statement), subqueries (Delta does not accept them in
MERGE, UPDATE or DELETE conditions), lambdas, window functions, and nesting deeper than
``MAX_NESTING`` parentheses or ``MAX_DEPTH`` tree levels (which would otherwise end in a
``RecursionError`` somewhere downstream).

Precedence, loosest first: OR, AND, NOT, predicates (IN, BETWEEN, LIKE, IS), comparison, ``|``,
``^``, ``&``, shifts, ``+ - ||``, ``* / % DIV``, unary ``- + ~``, postfix ``[i]`` ``.field``
``::type``, as in Spark's grammar.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from .errors import InvalidLiteralError, PredicateSyntaxError
from .expressions import (
    And,
    Column,
    Comparison,
    ComparisonOp,
    Expr,
    In,
    IsNull,
    Literal,
    Not,
    Or,
    Unknown,
    children,
)
from .schema import PrimitiveType
from .values import coerce_literal

NON_DETERMINISTIC_FUNCTIONS = frozenset(
    {"rand", "randn", "random", "uuid", "shuffle", "monotonically_increasing_id", "spark_partition_id",
     "input_file_name", "input_file_block_start", "input_file_block_length", "current_timestamp", "now",
     "current_date", "curdate", "unix_timestamp", "localtimestamp", "current_time", "try_reflect", "reflect",
     "java_method", "rand_str", "randstr", "uniform"}
)
REFLECTION_FUNCTIONS = frozenset({"reflect", "java_method", "try_reflect"})
# Words that cannot start an operand; others (``date``, ``timestamp``, ...) can also name columns.
_RESERVED = frozenset(
    {"and", "or", "not", "in", "is", "null", "true", "false", "between", "like", "rlike", "ilike", "regexp",
     "case", "when", "then", "else", "end", "exists", "select", "distinct", "escape", "div"}
)
_QUERY_WORDS = frozenset({"select", "with", "values", "from", "table"})
# Spark reads these unquoted names as the current date, time or user unless a column has the name.
_NILADIC = frozenset({"current_date", "current_timestamp", "current_time", "current_user", "user", "session_user",
                      "localtimestamp"})
_COMPARISON: dict[str, ComparisonOp] = {
    "=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "<=>": "<=>",
}
# Binary value operators by precedence level, loosest first (level 0 is comparison).
_BINARY_LEVELS: tuple[frozenset[str], ...] = (
    frozenset(_COMPARISON), frozenset({"|"}), frozenset({"^"}), frozenset({"&"}), frozenset({"<<", ">>", ">>>"}),
    frozenset({"+", "-", "||"}), frozenset({"*", "/", "%", "div"}),
)
_OPERATORS = ("<=>", ">>>", "<<", ">>", "<=", ">=", "<>", "!=", "==", "||", "::", "->", "=>", "=", "<", ">", "+",
              "-", "*", "/", "%", "&", "|", "^", "!", "~")
# Suffixed numbers keep Spark's type (``0.1F`` is a FLOAT, and 0.1F != 0.1D).
_NUMBER_SUFFIX_TYPES = {"f": PrimitiveType("float"), "l": PrimitiveType("long"), "s": PrimitiveType("short"),
                        "y": PrimitiveType("byte")}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "0": "\0", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_TYPES = frozenset({"boolean", "tinyint", "byte", "smallint", "short", "int", "integer", "bigint", "long", "float",
                    "real", "double", "date", "timestamp", "timestamp_ntz", "timestamp_ltz", "string", "binary",
                    "decimal", "dec", "numeric", "char", "varchar", "variant"})
_INTERVAL_UNITS = frozenset(
    {"year", "years", "month", "months", "week", "weeks", "day", "days", "hour", "hours", "minute", "minutes",
     "second", "seconds", "millisecond", "milliseconds", "microsecond", "microseconds"})
_EXTRACT_FIELDS = frozenset(
    {"year", "y", "years", "yr", "yrs", "yearofweek", "quarter", "qtr", "month", "mon", "mons", "months", "week",
     "w", "weeks", "day", "d", "days", "dayofweek", "dow", "dayofweek_iso", "dow_iso", "doy", "hour", "h", "hours",
     "hr", "hrs", "minute", "m", "min", "mins", "minutes", "second", "s", "sec", "seconds", "secs"})
MAX_NESTING = 32
"""Deepest parenthesis / call nesting accepted in one expression."""
MAX_DEPTH = 256
"""Deepest expression tree accepted (a chain of N ANDs is N levels)."""
MAX_LENGTH = 100_000
"""Longest expression text accepted (an IN list of thousands of values fits)."""
MAX_RENDERED_LENGTH = 2_000_000
"""Longest text accepted when it is a rendering of a tree already in memory (``parse_predicate``'s
``max_length``): a partition filter of ``partitions=``'s 10,000 values, or a source check that repeats
it for each way a MERGE writes rows, is longer than any condition an author types."""


@dataclass(frozen=True)
class Token:
    kind: str  # ident, qident, number, string, op, lparen, rparen, lbracket, rbracket, comma, dot, eof
    text: str
    value: Any
    start: int
    end: int

    def is_keyword(self, *words: str) -> bool:
        return self.kind == "ident" and self.text.lower() in words

    def is_op(self, *ops: str) -> bool:
        return self.kind == "op" and self.text in ops


SUBSTITUTION_MARKER = "${"
"""What Spark's variable substitution (``spark.sql.variable.substitute``) rewrites in a statement's text
before parsing it, inside quoted literals and identifiers too: never part of the provider's SQL."""
SUBSTITUTION_ADVICE = ("Spark's variable substitution (spark.sql.variable.substitute) would replace it before "
                       "parsing, so Spark would run another statement than the one checked")
_DIGITS = frozenset("0123456789")  # Spark's lexer knows only ASCII digits; Python's isdigit() knows more
_PUNCTUATION = {"(": "lparen", ")": "rparen", "[": "lbracket", "]": "rbracket", ",": "comma"}


def tokenize(text: str) -> list[Token]:
    """Spark's lexical rules for the accepted subset; comments and ``;`` are refused outright."""
    marker = text.find(SUBSTITUTION_MARKER)
    if marker >= 0:
        raise PredicateSyntaxError(f"'${{' is not accepted: {SUBSTITUTION_ADVICE}", text=text, position=marker)
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("--", i) or text.startswith("/*", i) or c == ";":
            raise PredicateSyntaxError("comments and ';' are not allowed in a predicate", text=text, position=i)
        start = i
        if c in "rR" and i + 1 < n and text[i + 1] in "'\"":
            # A raw string: backslashes are characters, and it ends at the next quote of its kind.
            close = text.find(text[i + 1], i + 2)
            if close < 0:
                raise PredicateSyntaxError("unterminated string literal", text=text, position=start)
            tokens.append(Token("string", text[start:close + 1], text[i + 2:close], start, close + 1))
            i = close + 1
        elif c.isalpha() or c == "_":
            while i < n and (text[i].isalnum() or text[i] == "_"):
                i += 1
            tokens.append(Token("ident", text[start:i], text[start:i], start, i))
        elif c == "`":
            value, i = _scan_quoted_identifier(text, i)
            tokens.append(Token("qident", text[start:i], value, start, i))
        elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            i = _scan_number(text, i)
            raw = text[start:i]
            if i < n and (text[i].isalpha() or text[i] == "_"):
                raise PredicateSyntaxError(f"malformed number {text[start:i + 1]!r}", text=text, position=start)
            number = _number_value(raw, text, start)
            if isinstance(number, float) and not math.isfinite(number):
                raise PredicateSyntaxError(f"number {raw!r} is out of range", text=text, position=start)
            tokens.append(Token("number", raw, number, start, i))
        elif c in "'\"":
            value, i = _scan_string(text, i)
            tokens.append(Token("string", text[start:i], value, start, i))
        elif c in _PUNCTUATION:
            tokens.append(Token(_PUNCTUATION[c], c, c, i, i + 1))
            i += 1
        elif c == ".":
            tokens.append(Token("dot", c, c, i, i + 1))
            i += 1
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise PredicateSyntaxError(f"unexpected character {c!r}", text=text, position=i)
            tokens.append(Token("op", op, op, i, i + len(op)))
            i += len(op)
    tokens.append(Token("eof", "", None, n, n))
    return tokens


def _scan_quoted_identifier(text: str, i: int) -> tuple[str, int]:
    start, n = i, len(text)
    i += 1
    buf = []
    while True:
        if i >= n:
            raise PredicateSyntaxError("unterminated quoted identifier", text=text, position=start)
        if text[i] == "`":
            if i + 1 < n and text[i + 1] == "`":
                buf.append("`")
                i += 2
                continue
            return "".join(buf), i + 1
        buf.append(text[i])
        i += 1


def _scan_number(text: str, i: int) -> int:
    n = len(text)
    while i < n and (text[i] in _DIGITS or text[i] == "."):
        i += 1
    if i < n and text[i] in "eE" and i + 1 < n and (text[i + 1] in _DIGITS or text[i + 1] in "+-"):
        i += 2
        while i < n and text[i] in _DIGITS:
            i += 1
    for suffix in ("BD", "bd", "L", "l", "S", "s", "Y", "y", "D", "d", "F", "f"):
        if text.startswith(suffix, i) and not (i + len(suffix) < n and (text[i + len(suffix)].isalnum()
                                                                        or text[i + len(suffix)] == "_")):
            return i + len(suffix)
    return i


def _number_value(raw: str, text: str, position: int) -> int | float | Decimal:
    lowered = raw.lower()
    try:
        if lowered.endswith("bd"):
            return Decimal(raw[:-2])
        if lowered[-1] in "lsy":
            return int(raw[:-1])
        if lowered[-1] in "df":
            return float(raw[:-1])
        if "e" in lowered:
            return float(raw)
        if "." in raw:
            return Decimal(raw)
        return int(raw)
    except (ValueError, InvalidOperation) as exc:
        raise PredicateSyntaxError(f"malformed number {raw!r}", text=text, position=position) from exc


def _scan_string(text: str, i: int) -> tuple[str, int]:
    """A quoted string with Spark's escapes (``\\n``, ``\\uXXXX``, ``\\UXXXXXXXX``, octal ``\\0dd``/``\\1dd``)."""
    quote = text[i]
    start = i
    i += 1
    buf: list[str] = []
    n = len(text)
    while True:
        if i >= n:
            raise PredicateSyntaxError("unterminated string literal", text=text, position=start)
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                raise PredicateSyntaxError("unterminated string literal", text=text, position=start)
            nxt = text[i + 1]
            if nxt == "u" and _is_hex(text[i + 2:i + 6], 4):
                buf.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
            elif nxt == "U" and _is_hex(text[i + 2:i + 10], 8) and int(text[i + 2:i + 10], 16) <= 0x10FFFF:
                buf.append(chr(int(text[i + 2:i + 10], 16)))
                i += 10
            elif nxt in "01" and len(text) > i + 3 and all(d in "01234567" for d in text[i + 2:i + 4]):
                buf.append(chr(int(text[i + 1:i + 4], 8)))
                i += 4
            else:
                buf.append(_ESCAPES.get(nxt, nxt))
                i += 2
        elif c == quote:  # Spark has no doubled-quote escape: 'a''b' is two literals, read as 'ab'
            return "".join(buf), i + 1
        else:
            buf.append(c)
            i += 1


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(ch in "0123456789abcdefABCDEF" for ch in text)


def _plain_name(name: str) -> bool:
    """Whether a name can be written unquoted (function names, types, units)."""
    return name.isascii() and (name[:1].isalpha() or name[:1] == "_") and all(
        ch.isalnum() or ch == "_" for ch in name)


def _opaque(text: str, *parts: Expr) -> Unknown:
    """An ``Unknown`` with canonical text, deterministic when all its parts are."""
    return Unknown(text, deterministic=all(_deterministic(p) for p in parts))


def _deterministic(expr: Expr) -> bool:
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, Unknown) and not e.deterministic:
            return False
        stack.extend(children(e))
    return True


def expression_depth(expr: Expr) -> int:
    """Levels of the expression tree (iterative: safe on any tree the parser could build)."""
    deepest = 0
    stack = [(expr, 1)]
    while stack:
        e, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((c, depth + 1) for c in children(e))
    return deepest


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0
        self.nesting = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def error(self, message: str, token: Token | None = None) -> PredicateSyntaxError:
        token = token or self.tok
        return PredicateSyntaxError(message, text=self.text, position=token.start)

    def found(self) -> str:
        return repr(self.tok.text) if self.tok.kind != "eof" else "end of input"

    def expect(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, found {self.found()}")
        return self.advance()

    def expect_keyword(self, word: str) -> Token:
        if not self.tok.is_keyword(word):
            raise self.error(f"expected {word.upper()}, found {self.found()}")
        return self.advance()

    def nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression nested more than {MAX_NESTING} levels deep")

    def refuse_subquery(self, token: Token) -> PredicateSyntaxError:
        return self.error("subqueries are not supported in a condition (Delta refuses them in MERGE, UPDATE and "
                          "DELETE conditions); join the data into the source instead", token)

    # -- boolean level ----------------------------------------------------------------------------
    def parse(self) -> Expr:
        if self.tok.kind == "eof":
            raise self.error("empty predicate")
        expr = self.parse_or()
        if self.tok.kind != "eof":
            raise self.error(f"unexpected {self.found()} after a complete predicate")
        if expression_depth(expr) > MAX_DEPTH:
            raise self.error(f"expression has more than {MAX_DEPTH} levels (too many ANDs/ORs in one chain?)",
                             self.tokens[0])
        return expr

    def parse_or(self) -> Expr:
        left = self.parse_and()
        while self.tok.is_keyword("or"):
            self.advance()
            left = Or(left, self.parse_and())
        return left

    def parse_and(self) -> Expr:
        left = self.parse_not()
        while self.tok.is_keyword("and"):
            self.advance()
            left = And(left, self.parse_not())
        return left

    def parse_not(self) -> Expr:
        negations = 0
        while self.tok.is_keyword("not") or self.tok.is_op("!"):
            self.advance()
            negations += 1
            if negations > MAX_NESTING:
                raise self.error(f"more than {MAX_NESTING} NOTs in a row")
        if self.tok.is_keyword("exists") and self.peek().kind == "lparen":
            raise self.refuse_subquery(self.tok)
        expr = self.parse_predicate()
        for _ in range(negations):
            expr = Not(expr)
        return expr

    def parse_predicate(self) -> Expr:
        left = self.parse_value()
        negated = False
        if self.tok.is_keyword("not") and self.peek().is_keyword("in", "between", "like", "rlike", "ilike",
                                                                  "regexp"):
            self.advance()
            negated = True
        tok = self.tok
        not_ = "NOT " if negated else ""
        if tok.is_keyword("in"):
            self.advance()
            return self.parse_in(left, negated)
        if tok.is_keyword("between"):
            self.advance()
            low = self.parse_value()
            self.expect_keyword("and")
            high = self.parse_value()
            if not _deterministic(left):  # BETWEEN evaluates its operand once
                return _opaque(f"{_operand(left)} {not_}BETWEEN {_operand(low)} AND {_operand(high)}", low, high,
                               left)
            between = And(Comparison(">=", left, low), Comparison("<=", left, high))
            return Not(between) if negated else between
        if tok.is_keyword("like", "ilike"):
            self.advance()
            word = tok.text.upper()
            if self.tok.is_keyword("any", "some", "all") and self.peek().kind == "lparen":
                quantifier = self.advance().text.upper()
                patterns = self.parse_arguments()
                return _opaque(f"{_operand(left)} {not_}{word} {quantifier} ({', '.join(map(to_sql, patterns))})",
                               left, *patterns)
            pattern = self.parse_value()
            escape = ""
            if self.tok.is_keyword("escape"):
                self.advance()
                esc = self.expect("string", "a string after ESCAPE")
                escape = f" ESCAPE {render_literal(esc.value)}"
            return _opaque(f"{_operand(left)} {not_}{word} {_operand(pattern)}{escape}", left, pattern)
        if tok.is_keyword("rlike", "regexp"):
            self.advance()
            pattern = self.parse_value()
            return _opaque(f"{_operand(left)} {not_}RLIKE {_operand(pattern)}", left, pattern)
        if tok.is_keyword("is"):
            self.advance()
            is_not = False
            if self.tok.is_keyword("not"):
                self.advance()
                is_not = True
            what = self.tok
            if what.is_keyword("null"):
                self.advance()
                return IsNull(left, negated=is_not)
            if what.is_keyword("true", "false", "unknown"):
                self.advance()
                return _opaque(f"{_operand(left)} IS {'NOT ' if is_not else ''}{what.text.upper()}", left)
            if what.is_keyword("distinct"):
                self.advance()
                self.expect_keyword("from")
                right = self.parse_value()
                same = Comparison("<=>", left, right)
                return same if is_not else Not(same)
            raise self.error(f"expected NULL, TRUE, FALSE, UNKNOWN or DISTINCT FROM after IS, found {self.found()}")
        if negated:
            raise self.error(f"expected IN, BETWEEN, LIKE or RLIKE after NOT, found {self.found()}")
        return left

    def parse_in(self, left: Expr, negated: bool) -> Expr:
        open_ = self.expect("lparen", "'(' after IN")
        if self.tok.is_keyword(*_QUERY_WORDS):
            raise self.refuse_subquery(open_)
        self.pos -= 1
        options = self.parse_arguments()
        if not options:
            raise self.error("IN needs at least one value", open_)
        return In(left, tuple(options), negated=negated)

    def parse_arguments(self) -> list[Expr]:
        """``( expr, ... )`` as in a function call or IN list; may be empty."""
        self.expect("lparen", "'('")
        self.nest()
        args: list[Expr] = []
        if self.tok.kind != "rparen":
            while True:
                if self.tok.is_op("*"):
                    raise self.error("'*' is not supported as an argument in a condition")
                args.append(self.parse_or())
                if self.tok.is_op("->", "=>"):
                    raise self.error("lambda functions and named arguments are not supported in a condition")
                if self.tok.kind != "comma":
                    break
                self.advance()
        self.expect("rparen", "')' or ','")
        self.nesting -= 1
        return args

    # -- value level ------------------------------------------------------------------------------
    def parse_value(self, level: int = 0) -> Expr:
        """Binary operators by precedence climbing: one loop per level, loosest (comparison) first."""
        if level == len(_BINARY_LEVELS):
            return self.parse_unary()
        left = self.parse_value(level + 1)
        ops = _BINARY_LEVELS[level]
        while (self.tok.kind == "op" and self.tok.text in ops) or (self.tok.kind == "ident"
                                                                   and self.tok.text.lower() in ops):
            op = self.advance().text
            right = self.parse_value(level + 1)
            if level == 0:
                left = Comparison(_COMPARISON[op], left, right)
            else:
                left = _opaque(f"{_operand(left)} {op.upper()} {_operand(right)}", left, right)
        return left

    def parse_unary(self) -> Expr:
        signs: list[Token] = []
        while self.tok.is_op("-", "+", "~"):
            signs.append(self.advance())
            if len(signs) > MAX_NESTING:
                raise self.error(f"more than {MAX_NESTING} signs in a row")
        expr = self.parse_postfix()
        for sign in reversed(signs):
            if sign.text in "+-" and isinstance(expr, Literal) and (expr.type is None or expr.type.name in (
                    "float", "long", "short", "byte")) and isinstance(expr.value, int | float | Decimal) \
                    and not isinstance(expr.value, bool):
                expr = Literal(-expr.value if sign.text == "-" else expr.value, expr.type)
            else:
                expr = _opaque(f"{sign.text} {_operand(expr)}", expr)
        return expr

    def parse_postfix(self) -> Expr:
        expr = self.parse_primary()
        for _ in range(MAX_NESTING + 1):
            if self.tok.kind == "lbracket":
                self.advance()
                self.nest()
                index = self.parse_or()
                self.expect("rbracket", "']'")
                self.nesting -= 1
                expr = _opaque(f"{_operand(expr)}[{to_sql(index)}]", expr, index)
            elif self.tok.kind == "dot" and not isinstance(expr, Column):
                self.advance()
                name = self.tok
                if name.kind not in ("ident", "qident"):
                    raise self.error("expected a field name after '.'")
                self.advance()
                expr = _opaque(f"{_operand(expr)}.{render_identifier(name.value)}", expr)
            elif self.tok.is_op("::"):
                self.advance()
                expr = _opaque(f"CAST({to_sql(expr)} AS {self.parse_type()})", expr)
            else:
                return expr
        raise self.error(f"more than {MAX_NESTING} subscripts, fields or casts in a row")

    def parse_primary(self) -> Expr:
        tok = self.tok
        if tok.kind == "number":
            self.advance()
            return Literal(tok.value, _NUMBER_SUFFIX_TYPES.get(tok.text[-1:].lower()) if tok.text[-2:].lower() != "bd"
                           else None)
        if tok.kind == "string":
            self.advance()
            value = tok.value
            while self.tok.kind == "string":  # adjacent literals concatenate, as in Spark
                value += self.advance().value
            return Literal(value, None)
        if tok.kind == "lparen":
            if self.peek().is_keyword(*_QUERY_WORDS):
                raise self.refuse_subquery(tok)
            self.advance()
            self.nest()
            inner = self.parse_or()
            if self.tok.kind == "comma":
                raise self.error("row values (a, b) are not supported in a condition")
            self.expect("rparen", "')'")
            self.nesting -= 1
            return inner
        if tok.kind == "qident":
            return self.parse_name()
        if tok.kind != "ident":
            raise self.error(f"unexpected {self.found()}")
        word = tok.text.lower()
        nxt = self.peek()
        if word in ("true", "false"):
            self.advance()
            return Literal(word == "true", PrimitiveType("boolean"))
        if word == "null":
            self.advance()
            return Literal(None, None)
        if nxt.kind == "string" and (word != "x" or nxt.start == tok.end):
            typed = self.parse_typed_literal(word)
            if typed is not None:
                return typed
        if word == "case":
            return self.parse_case()
        if word in ("cast", "try_cast") and nxt.kind == "lparen":
            self.advance()
            self.advance()
            self.nest()
            value = self.parse_or()
            self.expect_keyword("as")
            type_text = self.parse_type()
            self.expect("rparen", "')' after the CAST type")
            self.nesting -= 1
            return _opaque(f"{word.upper()}({to_sql(value)} AS {type_text})", value)
        if word == "extract" and nxt.kind == "lparen":
            self.advance()
            self.advance()
            self.nest()
            field = self.tok
            if not field.is_keyword(*_EXTRACT_FIELDS):
                raise self.error(f"expected a date/time field after EXTRACT(, found {self.found()}")
            self.advance()
            self.expect_keyword("from")
            value = self.parse_or()
            self.expect("rparen", "')'")
            self.nesting -= 1
            return _opaque(f"EXTRACT({field.text.upper()} FROM {to_sql(value)})", value)
        if word == "interval":
            return self.parse_interval()
        if word in _NILADIC and nxt.kind not in ("lparen", "dot"):
            self.advance()
            return Unknown(word.upper(), deterministic=False)
        if word in _RESERVED:
            raise self.error(f"unexpected keyword {tok.text.upper()!r}")
        return self.parse_name()

    def parse_typed_literal(self, word: str) -> Expr | None:
        """``DATE'...'``, ``TIMESTAMP'...'``, ``X'ab'``; ``None`` when ``word`` is not such a prefix."""
        if word in ("date", "timestamp", "timestamp_ntz", "timestamp_ltz"):
            self.advance()
            text_token = self.advance()
            data_type = PrimitiveType("timestamp" if word == "timestamp_ltz" else word)
            try:
                return Literal(coerce_literal(text_token.value, data_type), data_type)
            except InvalidLiteralError as exc:
                raise InvalidLiteralError(text_token.value, word, reason=exc.reason) from exc
        if word == "x":
            self.advance()
            hex_token = self.advance()
            if not _is_hex(hex_token.value, len(hex_token.value)) or len(hex_token.value) % 2:
                raise self.error("X'...' needs an even number of hexadecimal digits", hex_token)
            return Literal(bytes.fromhex(hex_token.value), PrimitiveType("binary"))
        return None

    def parse_interval(self) -> Expr:
        start = self.advance()
        parts: list[str] = []
        while self.tok.kind in ("string", "number") or (self.tok.is_op("-", "+") and self.peek().kind == "number"):
            sign = self.advance().text if self.tok.kind == "op" else ""
            value = self.advance()
            part = render_literal(value.value) if value.kind == "string" else f"{sign}{value.text}"
            if self.tok.is_keyword(*_INTERVAL_UNITS):
                part += " " + self.advance().text.upper()
                if self.tok.is_keyword("to"):
                    self.advance()
                    if not self.tok.is_keyword(*_INTERVAL_UNITS):
                        raise self.error(f"expected an interval unit after TO, found {self.found()}")
                    part += " TO " + self.advance().text.upper()
            elif value.kind == "number":
                raise self.error(f"expected an interval unit, found {self.found()}")
            elif parts or self.tok.kind == "string":
                # Spark takes a string without a unit only as the whole interval ('1 day 2 hours').
                raise self.error("an interval string without a unit must be the interval's only part", value)
            else:
                parts.append(part)
                break
            parts.append(part)
        if not parts:
            raise self.error("expected a value after INTERVAL", start)
        return Unknown(f"INTERVAL {' '.join(parts)}", deterministic=True)

    def parse_type(self) -> str:
        """A CAST target type, rendered canonically (primitive types, DECIMAL(p, s), ARRAY<t>, MAP<k, v>)."""
        tok = self.tok
        name = tok.text.lower()
        if tok.kind != "ident":
            raise self.error(f"expected a type name, found {self.found()}")
        self.advance()
        if name in ("array", "map") and self.tok.is_op("<"):
            self.advance()
            inner = [self.parse_type()]
            if name == "map":
                self.expect("comma", "',' between the MAP key and value types")
                inner.append(self.parse_type())
            if not self.tok.is_op(">"):
                raise self.error(f"expected '>' to close {name.upper()}<...> (nested complex types are not "
                                 f"supported), found {self.found()}")
            self.advance()
            return f"{name.upper()}<{', '.join(inner)}>"
        if name not in _TYPES:
            raise self.error(f"unsupported type {tok.text!r} in CAST", tok)
        if self.tok.kind == "lparen":
            self.advance()
            params = [self.expect("number", "a number").value]
            if self.tok.kind == "comma":
                self.advance()
                params.append(self.expect("number", "a number").value)
            self.expect("rparen", "')'")
            if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= 65535 for p in params):
                raise self.error("type parameters must be small whole numbers", tok)
            return f"{name.upper()}({', '.join(str(p) for p in params)})"
        return name.upper()

    def parse_case(self) -> Expr:
        start = self.advance()
        self.nest()
        parts: list[Expr] = []
        text = "CASE"
        if not self.tok.is_keyword("when"):
            operand = self.parse_or()
            parts.append(operand)
            text += f" {to_sql(operand)}"
        if not self.tok.is_keyword("when"):
            raise self.error(f"expected WHEN in CASE, found {self.found()}")
        while self.tok.is_keyword("when"):
            self.advance()
            condition = self.parse_or()
            self.expect_keyword("then")
            value = self.parse_or()
            parts += [condition, value]
            text += f" WHEN {to_sql(condition)} THEN {to_sql(value)}"
        if self.tok.is_keyword("else"):
            self.advance()
            other = self.parse_or()
            parts.append(other)
            text += f" ELSE {to_sql(other)}"
        if not self.tok.is_keyword("end"):
            raise self.error(f"expected END to close the CASE at position {start.start}, found {self.found()}")
        self.advance()
        self.nesting -= 1
        return _opaque(text + " END", *parts)

    def parse_name(self) -> Expr:
        """A column (``a``, ``t.a``, ``t.s.field``) or a function call (``f(x)``, ``db.f(x)``)."""
        first = self.advance()
        parts = [(first.value, first.kind == "qident")]
        while self.tok.kind == "dot":
            self.advance()
            if self.tok.kind not in ("ident", "qident"):
                raise self.error("expected a name after '.'")
            part = self.advance()
            parts.append((part.value, part.kind == "qident"))
        if self.tok.kind == "lparen":
            if self.peek().is_keyword("distinct", "all"):
                raise self.error("aggregate functions (DISTINCT/ALL) are not supported in a condition", self.peek())
            args = self.parse_arguments()
            names = [name for name, _ in parts]
            if len(parts) == 1 and not parts[0][1] and _plain_name(names[0]):
                rendered = names[0]
            else:
                rendered = ".".join(render_identifier(n) for n in names)
            if len(parts) == 1 and not parts[0][1] and names[0].lower() == "identifier":
                raise self.error("IDENTIFIER() makes a string name a column, table or function when Spark runs the "
                                 "statement; write the name itself", first)
            if names[-1].lower() in REFLECTION_FUNCTIONS:
                raise self.error(f"{names[-1]}() calls Java methods on the cluster; it is not accepted in a "
                                 "condition", first)
            deterministic = names[-1].lower() not in NON_DETERMINISTIC_FUNCTIONS
            call = _opaque(f"{rendered}({', '.join(to_sql(a) for a in args)})", *args)
            return call if deterministic else Unknown(call.text, deterministic=False)
        names = [name for name, _ in parts]
        if len(names) == 1 and names[0].lower() in _NILADIC:
            # Spark resolves `current_date` to the function unless a column has the name, quoted or not.
            return Unknown(names[0].upper(), deterministic=False)
        if any("." in name for name in names):
            # A dotted name is a path to a nested field in the expression model; a name that holds a
            # dot itself cannot be told apart from one.
            raise self.error("a column name that contains '.' is not supported in a condition", first)
        if len(names) == 1:
            return Column(names[0])
        return Column(".".join(names[1:]), qualifier=names[0])


def parse_predicate(text: str, *, max_length: int = MAX_LENGTH) -> Expr:
    """Parse condition or expression text completely into an (unbound) expression; text longer than
    ``max_length`` is refused.

    Raises:
        PredicateSyntaxError: the text is not an expression of the supported grammar, or is nested
            too deeply; the message points at the position.
        InvalidLiteralError: a typed literal such as ``DATE'2024-13-01'`` is not a valid value.
    """
    if not isinstance(text, str):
        raise TypeError(f"predicate must be a string, got {type(text).__name__}")
    if len(text) > max_length:
        raise PredicateSyntaxError(f"expression is {len(text)} characters long; at most {max_length} are accepted",
                                   text=text[:80], position=0)
    return _Parser(text).parse()


def to_sql(expr: Expr, *, qualifier: str | None = None) -> str:
    """Spark SQL for an expression: identifiers in backticks, literals escaped by type, and every
    compound node parenthesized, so the text parses back to the same tree whatever it holds.

    ``qualifier`` replaces every column's qualifier (``t`` gives ``t.col``).
    """
    def r(e: Expr) -> str:
        if isinstance(e, Column):
            parts = ([qualifier] if qualifier else ([e.qualifier] if e.qualifier else [])) + e.name.split(".")
            return ".".join(render_identifier(p) for p in parts)
        if isinstance(e, Literal):
            return render_literal(e.value, e.type)
        if isinstance(e, Comparison):
            return f"{o(e.left)} {e.op} {o(e.right)}"
        if isinstance(e, In):
            options = ", ".join(r(x) for x in e.options)
            return f"{o(e.value)} {'NOT IN' if e.negated else 'IN'} ({options})"
        if isinstance(e, IsNull):
            return f"{o(e.value)} IS {'NOT NULL' if e.negated else 'NULL'}"
        if isinstance(e, And):
            return f"({r(e.left)} AND {r(e.right)})"
        if isinstance(e, Or):
            return f"({r(e.left)} OR {r(e.right)})"
        if isinstance(e, Not):
            return f"(NOT {r(e.child)})"
        return f"({e.text})"

    def o(e: Expr) -> str:  # an operand: predicates nested in a comparison keep their own parentheses
        return f"({r(e)})" if isinstance(e, Comparison | In | IsNull) else r(e)

    text = r(expr)
    return text[1:-1] if isinstance(expr, And | Or | Not) else text  # the outermost needs no parentheses


def _operand(expr: Expr) -> str:
    """An expression as the operand of an operator: parenthesized unless it is a single term."""
    text = to_sql(expr)
    return f"({text})" if isinstance(expr, Comparison | In | IsNull | And | Or | Not) else text


def render_literal(value: Any, data_type: Any = None) -> str:
    """Spark SQL for a literal value, escaped for Spark's default string parser.

    ``data_type`` keeps a FLOAT a FLOAT (``0.1F``) and a LONG a LONG; Spark compares a FLOAT column
    with ``0.1D`` after widening it to DOUBLE, where the two differ.
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    type_name = getattr(data_type, "name", None)
    if isinstance(value, int):
        suffix = {"long": "L", "short": "S", "byte": "Y"}.get(str(type_name), "")
        return str(value) + (suffix or ("L" if not -(2**31) <= value < 2**31 else ""))
    if isinstance(value, float):
        sql_type = "FLOAT" if type_name == "float" else "DOUBLE"
        if value != value or value in (float("inf"), float("-inf")):
            word = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
            return f"CAST('{word}' AS {sql_type})"
        return repr(value) + ("F" if type_name == "float" else "D")
    if isinstance(value, Decimal):
        return f"{value}BD"
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return f"TIMESTAMP_NTZ'{value.isoformat(sep=' ')}'"
        return f"TIMESTAMP'{value.astimezone(dt.UTC).isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE'{value.isoformat()}'"
    if isinstance(value, bytes):
        return "X'" + value.hex().upper() + "'"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r") + "'"
    raise TypeError(f"cannot render {type(value).__name__} as a SQL literal")


def render_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
