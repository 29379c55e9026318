"""The one check that a value becoming statement text holds nothing Spark rewrites before parsing.

Spark's variable substitution replaces ``${...}`` anywhere in a statement (see
``engine.sql_parser.SUBSTITUTION_MARKER``). The runner turns it off for the provider's statements;
this check is the second line, run on every value where it enters: the operators' arguments at
DAG parse time, their rendered values when the job is built, and every text field of a ``JobSpec``
(so a spec decoded from JSON on a cluster gets it too).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from airflow_delta_occ.engine.sql_parser import SUBSTITUTION_ADVICE, SUBSTITUTION_MARKER
from airflow_delta_occ.exceptions import StatementTextError


def refuse_substitution(value: object, what: str, *, rendered: bool = True) -> None:
    """Refuse ``value`` (a string, or the strings of a mapping's keys and values or of a list) if
    any holds ``${``.

    Before templates are rendered (``rendered=False``, at DAG parse time) ``${{`` is the start of a
    Jinja expression after a dollar sign, judged once rendered.

    Raises:
        StatementTextError: naming ``what`` and the offending text (shortened).
    """
    for text in strings_in(value):
        if _holds_marker(text, rendered):
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise StatementTextError(f"{what} holds '${{' ({shown!r}): {SUBSTITUTION_ADVICE}. The provider refuses "
                                     "it; nothing was run")


def _holds_marker(text: str, rendered: bool) -> bool:
    at = text.find(SUBSTITUTION_MARKER)
    while at >= 0:
        if rendered or not text.startswith("{", at + len(SUBSTITUTION_MARKER)):
            return True
        at = text.find(SUBSTITUTION_MARKER, at + 1)
    return False


def strings_in(value: object) -> Iterable[str]:
    """Every string in ``value``: itself, or the keys and values of nested mappings and lists."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from strings_in(key)
            yield from strings_in(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from strings_in(item)
