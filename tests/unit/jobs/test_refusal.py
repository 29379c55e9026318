"""Spark's refusal pointed into the author's own argument, not into the statement the provider rendered."""

from __future__ import annotations

from airflow_delta_occ.jobs.build import DeleteArguments, MergeArguments, SourceArguments, UpdateArguments
from airflow_delta_occ.jobs.refusal import point_into_arguments

# Spark 4.2's message for an unknown source column in the rendered MERGE (its first line, as the runner keeps it).
UNRESOLVED = ("[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name "
              "`s`.`no_such_column` cannot be resolved. Did you mean one of the following? [`s`.`id`, `t`.`id`, "
              "`s`.`v`]. SQLSTATE: 42703; line 1 pos 127")


def _merge(condition: str, clauses: list[dict[str, object]] | None = None) -> MergeArguments:
    return MergeArguments(merge_condition=condition, source=SourceArguments(path="/landing/de"),
                          clauses=clauses or [])


def test_an_unknown_column_is_pointed_at_in_the_merge_condition() -> None:
    message = point_into_arguments(UNRESOLVED, _merge("t.id = s.id AND t.v > s.no_such_column"))
    first, where, caret = message.splitlines()
    assert "line 1 pos" not in first and first.endswith("SQLSTATE: 42703")
    assert where == "  in merge_condition: t.id = s.id AND t.v > s.no_such_column"
    assert caret.index("^") == where.index("s.no_such_column")


def test_deltas_merge_refusal_is_pointed_at_too() -> None:
    """delta-spark 4.4's own message for the same MERGE (real: tests/spark/test_operators.py)."""
    delta = ("[DELTA_MERGE_UNRESOLVED_EXPRESSION] Cannot resolve s.no_such_column in search condition given columns "
             "t.id, t.v, t.date, t.country, s.id, s.v, s.date, s.country.")
    where, caret = point_into_arguments(delta, _merge("t.id = s.id AND t.v < s.no_such_column")).splitlines()[1:]
    assert where[caret.index("^"):] == "s.no_such_column"


def test_it_is_found_in_a_clause_spelled_with_back_quotes_and_spaces() -> None:
    clauses: list[dict[str, object]] = [{"kind": "matched_update", "set": {"v": "s . `No_Such_Column` + 1"}}]
    message = point_into_arguments(UNRESOLVED, _merge("t.id = s.id", clauses))
    where, caret = message.splitlines()[1:]
    assert where.startswith("  in clauses[0]['set']['v']: ")
    assert where[caret.index("^"):].startswith("s . `No_Such_Column`")


def test_a_name_the_author_did_not_write_gets_no_caret_and_no_statement_position() -> None:
    message = point_into_arguments(UNRESOLVED, _merge("t.id = s.id"))
    assert message == UNRESOLVED.removesuffix("; line 1 pos 127")   # not s.id of the suggestions
    parse = "[PARSE_SYNTAX_ERROR] Syntax error at or near 'WHERE'. SQLSTATE: 42601 (line 1, pos 40)"
    assert point_into_arguments(parse, DeleteArguments(where="id = 1")) == parse.removesuffix(" (line 1, pos 40)")


def test_a_multi_line_argument_shows_the_line_with_the_name() -> None:
    message = point_into_arguments(UNRESOLVED.replace("`s`.", ""), UpdateArguments(
        set={"v": "CASE WHEN id > 1\n  THEN no_such_column\nEND"}))
    where, caret = message.splitlines()[1:]
    assert where == "  in set['v']:   THEN no_such_column"
    assert caret.index("^") == where.index("no_such_column")


def test_tabs_and_empty_names_give_a_true_caret_or_none() -> None:
    """Review: a tab before the name put the caret in the wrong column; an empty name pointed anywhere."""
    where, caret = point_into_arguments(UNRESOLVED, _merge("t.id = s.id AND\ts.no_such_column > 0")).splitlines()[1:]
    assert "\t" not in where and where[caret.index("^"):].startswith("s.no_such_column")
    empty = "[UNRESOLVED_COLUMN] A column with name `` cannot be resolved. SQLSTATE: 42703"
    assert point_into_arguments(empty, DeleteArguments(where="a = 1")) == empty
