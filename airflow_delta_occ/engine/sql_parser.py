"""Parser for the SQL subset of partition filters and simple conditions.

Hand-written (tokenizer + recursive descent) so the accepted language is exactly what the engine
can evaluate. Constructs outside it that are still valid SQL (function calls, arithmetic, LIKE,
CASE, subqueries) become ``Unknown`` nodes that keep their source text: the file-set computation
then answers "whole table" instead of failing. Comments and ``;`` are rejected outright, because
in a value they are the usual way to smuggle a second statement into SQL.

Precedence, loosest first: OR, AND, NOT, then comparison / IN / IS / BETWEEN / LIKE.
"""

from __future__ import annotations

import datetime as dt
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
)
from .schema import PrimitiveType
from .values import coerce_literal

NON_DETERMINISTIC_FUNCTIONS = frozenset(
    {"rand", "randn", "random", "uuid", "shuffle", "monotonically_increasing_id", "spark_partition_id",
     "input_file_name", "current_timestamp", "now", "current_date", "unix_timestamp", "localtimestamp",
     "try_reflect", "reflect", "java_method"}
)
# Words that cannot start an operand; others (``date``, ``timestamp``, ...) can also name columns.
_RESERVED = frozenset(
    {"and", "or", "not", "in", "is", "null", "true", "false", "between", "like", "rlike", "ilike",
     "case", "when", "then", "else", "end", "exists", "select"}
)
_COMPARISON: dict[str, ComparisonOp] = {
    "=": "=", "==": "=", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "<=>": "<=>",
}
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "||", "&", "|", "^", "::"})
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "0": "\0", "Z": "\x1a", "%": "\\%", "_": "\\_"}


@dataclass(frozen=True)
class Token:
    kind: str  # ident, qident, number, string, op, lparen, rparen, comma, dot, eof
    text: str
    value: Any
    start: int
    end: int

    def is_keyword(self, *words: str) -> bool:
        return self.kind == "ident" and self.text.lower() in words


def tokenize(text: str) -> list[Token]:
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
        if c.isalpha() or c == "_":
            while i < n and (text[i].isalnum() or text[i] == "_"):
                i += 1
            tokens.append(Token("ident", text[start:i], text[start:i], start, i))
        elif c == "`":
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
                    i += 1
                    break
                buf.append(text[i])
                i += 1
            tokens.append(Token("qident", text[start:i], "".join(buf), start, i))
        elif c.isdigit() or (c == "." and i + 1 < n and text[i + 1].isdigit()):
            i = _scan_number(text, i)
            raw = text[start:i]
            tokens.append(Token("number", raw, _number_value(raw, text, start), start, i))
        elif c in "'\"":
            value, i = _scan_string(text, i)
            tokens.append(Token("string", text[start:i], value, start, i))
        elif c == "(":
            tokens.append(Token("lparen", c, c, i, i + 1))
            i += 1
        elif c == ")":
            tokens.append(Token("rparen", c, c, i, i + 1))
            i += 1
        elif c == ",":
            tokens.append(Token("comma", c, c, i, i + 1))
            i += 1
        elif c == ".":
            tokens.append(Token("dot", c, c, i, i + 1))
            i += 1
        else:
            for op in ("<=>", "<=", ">=", "<>", "!=", "==", "||", "::", "=", "<", ">", "+", "-", "*", "/", "%",
                       "&", "|", "^", "!"):
                if text.startswith(op, i):
                    tokens.append(Token("op", op, op, i, i + len(op)))
                    i += len(op)
                    break
            else:
                raise PredicateSyntaxError(f"unexpected character {c!r}", text=text, position=i)
    tokens.append(Token("eof", "", None, n, n))
    return tokens


def _scan_number(text: str, i: int) -> int:
    n = len(text)
    while i < n and (text[i].isdigit() or text[i] == "."):
        i += 1
    if i < n and text[i] in "eE" and i + 1 < n and (text[i + 1].isdigit() or text[i + 1] in "+-"):
        i += 2
        while i < n and text[i].isdigit():
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
            buf.append(_ESCAPES.get(nxt, nxt))
            i += 2
        elif c == quote:
            if i + 1 < n and text[i + 1] == quote:  # doubled quote stands for one quote
                buf.append(quote)
                i += 2
            else:
                return "".join(buf), i + 1
        else:
            buf.append(c)
            i += 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.pos = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def error(self, message: str, token: Token | None = None) -> PredicateSyntaxError:
        token = token or self.tok
        return PredicateSyntaxError(message, text=self.text, position=token.start)

    def expect(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, found {self.tok.text or 'end of input'!r}")
        return self.advance()

    def expect_keyword(self, word: str) -> Token:
        if not self.tok.is_keyword(word):
            raise self.error(f"expected {word.upper()}, found {self.tok.text or 'end of input'!r}")
        return self.advance()

    def parse(self) -> Expr:
        if self.tok.kind == "eof":
            raise self.error("empty predicate")
        expr = self.parse_or()
        if self.tok.kind != "eof":
            raise self.error(f"unexpected {self.tok.text!r} after a complete predicate")
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
        if self.tok.is_keyword("not") or (self.tok.kind == "op" and self.tok.text == "!"):
            self.advance()
            return Not(self.parse_not())
        return self.parse_predicate()

    def parse_predicate(self) -> Expr:
        start = self.tok.start
        left = self.parse_additive()
        tok = self.tok
        if tok.kind == "op" and tok.text in _COMPARISON:
            self.advance()
            right = self.parse_additive()
            return Comparison(_COMPARISON[tok.text], left, right)
        negated = False
        if tok.is_keyword("not") and self.tokens[self.pos + 1].is_keyword("in", "between", "like", "rlike",
                                                                            "ilike", "regexp"):
            self.advance()
            negated = True
            tok = self.tok
        if tok.is_keyword("in"):
            self.advance()
            return self.parse_in(left, negated, start)
        if tok.is_keyword("between"):
            self.advance()
            low = self.parse_additive()
            self.expect_keyword("and")
            high = self.parse_additive()
            between = And(Comparison(">=", left, low), Comparison("<=", left, high))
            return Not(between) if negated else between
        if tok.is_keyword("is"):
            self.advance()
            is_not = False
            if self.tok.is_keyword("not"):
                self.advance()
                is_not = True
            if self.tok.is_keyword("null"):
                self.advance()
                return IsNull(left, negated=is_not)
            if self.tok.is_keyword("true", "false", "distinct", "unknown"):
                self.skip_until_boundary()
                return Unknown(self.text[start:self.tokens[self.pos - 1].end], deterministic=True)
            raise self.error("expected NULL after IS")
        if tok.is_keyword("like", "rlike", "ilike", "regexp"):
            self.advance()
            self.parse_additive()
            if self.tok.is_keyword("escape"):
                self.advance()
                self.parse_additive()
            return Unknown(self.text[start:self.tokens[self.pos - 1].end], deterministic=True)
        return left

    def parse_in(self, left: Expr, negated: bool, start: int) -> Expr:
        self.expect("lparen", "'(' after IN")
        if self.tok.is_keyword("select"):
            self.skip_balanced()
            return Unknown(self.text[start:self.tokens[self.pos - 1].end], deterministic=True)
        options = [self.parse_additive()]
        while self.tok.kind == "comma":
            self.advance()
            options.append(self.parse_additive())
        self.expect("rparen", "')' to close IN list")
        return In(left, tuple(options), negated=negated)

    def skip_balanced(self) -> None:
        """Skip to just after the ')' matching an already consumed '('."""
        depth = 1
        while depth:
            token = self.advance()
            if token.kind == "eof":
                raise self.error("unbalanced parentheses", token)
            depth += {"lparen": 1, "rparen": -1}.get(token.kind, 0)

    def skip_until_boundary(self) -> None:
        while not (self.tok.kind in ("eof", "rparen", "comma") or self.tok.is_keyword("and", "or")):
            if self.advance().kind == "lparen":
                self.skip_balanced()

    def parse_additive(self) -> Expr:
        start = self.tok.start
        left = self.parse_unary()
        arithmetic = False
        while self.tok.kind == "op" and self.tok.text in _ARITHMETIC:
            self.advance()
            self.parse_unary()
            arithmetic = True
        if arithmetic:
            return Unknown(self.text[start:self.tokens[self.pos - 1].end], deterministic=_deterministic(left))
        return left

    def parse_unary(self) -> Expr:
        tok = self.tok
        if tok.kind == "op" and tok.text in ("-", "+") and self.tokens[self.pos + 1].kind == "number":
            self.advance()
            number = self.advance()
            value = -number.value if tok.text == "-" else number.value
            return Literal(value, None)
        if tok.kind == "op" and tok.text in ("-", "+"):
            self.advance()
            operand = self.parse_primary()
            return Unknown(self.text[tok.start:self.tokens[self.pos - 1].end], deterministic=_deterministic(operand))
        return self.parse_primary()

    def parse_primary(self) -> Expr:
        tok = self.tok
        if tok.kind == "number":
            self.advance()
            return Literal(tok.value, None)
        if tok.kind == "string":
            self.advance()
            value = tok.value
            while self.tok.kind == "string":  # adjacent literals concatenate, as in Spark
                value += self.advance().value
            return Literal(value, None)
        if tok.kind == "lparen":
            self.advance()
            if self.tok.is_keyword("select"):
                self.skip_balanced()
                return Unknown(self.text[tok.start:self.tokens[self.pos - 1].end], deterministic=True)
            inner = self.parse_or()
            self.expect("rparen", "')'")
            return inner
        if tok.kind == "qident":
            return self.parse_column()
        if tok.kind != "ident":
            raise self.error(f"unexpected {tok.text or 'end of input'!r}")
        word = tok.text.lower()
        if word in ("true", "false"):
            self.advance()
            return Literal(word == "true", PrimitiveType("boolean"))
        if word == "null":
            self.advance()
            return Literal(None, None)
        if word in ("date", "timestamp", "timestamp_ntz") and self.tokens[self.pos + 1].kind == "string":
            self.advance()
            text_token = self.advance()
            data_type = PrimitiveType(word)
            try:
                return Literal(coerce_literal(text_token.value, data_type), data_type)
            except InvalidLiteralError as exc:
                raise InvalidLiteralError(text_token.value, word) from exc
        if word == "case":
            return self.parse_case()
        if word == "exists":
            self.advance()
            self.expect("lparen", "'(' after EXISTS")
            self.skip_balanced()
            return Unknown(self.text[tok.start:self.tokens[self.pos - 1].end], deterministic=True)
        if word == "interval" and self.tokens[self.pos + 1].kind in ("string", "number"):
            self.advance()
            self.skip_until_boundary()
            return Unknown(self.text[tok.start:self.tokens[self.pos - 1].end], deterministic=True)
        if self.tokens[self.pos + 1].kind == "lparen":
            self.advance()
            self.advance()
            self.skip_balanced()
            return Unknown(self.text[tok.start:self.tokens[self.pos - 1].end],
                           deterministic=word not in NON_DETERMINISTIC_FUNCTIONS)
        if word in _RESERVED:
            raise self.error(f"unexpected keyword {tok.text.upper()!r}")
        return self.parse_column()

    def parse_case(self) -> Expr:
        start = self.advance()
        depth = 1
        while depth:
            token = self.advance()
            if token.kind == "eof":
                raise self.error("CASE without END", start)
            if token.is_keyword("case"):
                depth += 1
            elif token.is_keyword("end"):
                depth -= 1
        return Unknown(self.text[start.start:self.tokens[self.pos - 1].end], deterministic=True)

    def parse_column(self) -> Expr:
        parts = [self.advance().value]
        while self.tok.kind == "dot":
            self.advance()
            if self.tok.kind not in ("ident", "qident"):
                raise self.error("expected a name after '.'")
            parts.append(self.advance().value)
        if len(parts) == 1:
            return Column(parts[0])
        return Column(".".join(parts[1:]), qualifier=parts[0])


def _deterministic(expr: Expr) -> bool:
    return not isinstance(expr, Unknown) or expr.deterministic


def parse_predicate(text: str) -> Expr:
    """Parse predicate text into an (unbound) expression.

    Raises:
        PredicateSyntaxError: the text is not a predicate in the supported grammar.
        InvalidLiteralError: a typed literal such as ``DATE'2024-13-01'`` is not a valid value.
    """
    if not isinstance(text, str):
        raise TypeError(f"predicate must be a string, got {type(text).__name__}")
    return _Parser(text).parse()


def render_literal(value: Any, data_type: Any = None) -> str:
    """Spark SQL for a literal value, escaped for Spark's default string parser."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value) + ("L" if not -(2**31) <= value < 2**31 else "")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            word = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
            return f"CAST('{word}' AS DOUBLE)"
        return repr(value) + "D"
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
