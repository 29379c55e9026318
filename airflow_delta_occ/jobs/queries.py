"""What may run as a job's source query: a single query, never a statement that writes.

``spark.sql`` runs a command (INSERT, DELETE, MERGE, DDL) the moment it is parsed, and Spark's grammar
accepts ``WITH c AS (...) DELETE FROM t``, so looking at the first word is not enough. The main
statement after the CTE definitions must be a query. The runner adds a second, independent line:
it hands Spark ``SELECT * FROM (<query>)``, where Spark's own parser accepts only a query.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_delta_occ.engine.errors import PredicateSyntaxError
from airflow_delta_occ.engine.sql_parser import REFLECTION_FUNCTIONS, Token, tokenize
from airflow_delta_occ.exceptions import UnsafeExpressionError

QUERY_STARTS = ("select", "values", "from", "table")
# Statement words that never appear unquoted in a query (quote a column named like them).
WRITING_WORDS = ("insert", "update", "delete", "merge", "create", "drop", "alter", "truncate", "overwrite")


def check_source_query(query: str) -> str:
    """Return ``query`` if it is one query without comments or ``;``.

    Raises:
        UnsafeExpressionError: comments, ``;``, unbalanced quotes, or a main statement that is not a
            query (SELECT, VALUES, FROM, TABLE, a parenthesized query, or WITH ... one of those).
    """
    if not isinstance(query, str) or not query.strip():
        raise UnsafeExpressionError(f"source_query must be a non-empty query, got {query!r}")
    try:
        tokens = tokenize(query)
    except PredicateSyntaxError as exc:
        raise UnsafeExpressionError(f"source_query is not accepted: {exc}") from exc
    start = _after_ctes(tokens)
    main = tokens[start]
    if not (main.is_keyword(*QUERY_STARTS) or main.kind == "lparen"):
        raise UnsafeExpressionError(
            "source_query must be a query (SELECT, VALUES, FROM, TABLE or WITH ... SELECT); its main statement "
            f"starts with {main.text or 'nothing'!r} at position {main.start}")
    depth = 0
    for index, token in enumerate(tokens):
        depth += {"lparen": 1, "rparen": -1}.get(token.kind, 0)
        following = tokens[min(index + 1, len(tokens) - 1)]
        if token.is_keyword("using") and following.kind == "string":
            raise UnsafeExpressionError(f"source_query runs a script (TRANSFORM/MAP/REDUCE ... USING) at position "
                                        f"{token.start}; only a plain query is accepted")
        if (token.kind == "qident" and str(token.value).lower() in REFLECTION_FUNCTIONS) or (
                token.is_keyword("identifier") and following.kind == "lparen"):
            raise UnsafeExpressionError(f"source_query may not name functions by IDENTIFIER() or call Java methods "
                                        f"({token.text} at position {token.start})")
        if depth < 0:
            raise UnsafeExpressionError(f"source_query closes a parenthesis it never opened at position {token.start}")
        # ``FROM src INSERT INTO t SELECT ...`` is Spark's multi-insert statement, in parentheses or not.
        if token.is_keyword(*WRITING_WORDS, *REFLECTION_FUNCTIONS):
            raise UnsafeExpressionError(f"source_query must be a query that writes nothing and calls no Java "
                                        f"methods; it holds {token.text!r} at position {token.start} (quote a "
                                        "column of that name in backticks)")
    if depth:
        raise UnsafeExpressionError("source_query has unbalanced parentheses")
    return query


def _after_ctes(tokens: Sequence[Token]) -> int:
    """Index of the first token after ``WITH [RECURSIVE] name [(cols)] [AS] (query), ...``."""
    if not tokens[0].is_keyword("with"):
        return 0
    i = 2 if tokens[1].is_keyword("recursive") else 1
    while tokens[i].kind in ("ident", "qident"):
        i += 1
        if tokens[i].kind == "lparen":
            i = _after_parentheses(tokens, i)
        if tokens[i].is_keyword("as"):
            i += 1
        if tokens[i].kind != "lparen":
            return i
        i = _after_parentheses(tokens, i)
        if tokens[i].kind != "comma":
            return i
        i += 1
    return i


def _after_parentheses(tokens: Sequence[Token], i: int) -> int:
    depth = 0
    while tokens[i].kind != "eof":
        depth += {"lparen": 1, "rparen": -1}.get(tokens[i].kind, 0)
        i += 1
        if depth == 0:
            return i
    return i
