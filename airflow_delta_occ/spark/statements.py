"""The session settings the provider's SQL text is rendered for, and the one way a statement runs.

Spark does not parse the text it is given as is: with ``spark.sql.variable.substitute`` on (the
default) it first replaces ``${conf}``, ``${env:NAME}`` and ``${system:NAME}`` anywhere in it,
inside quoted literals and backtick identifiers too; ``spark.sql.parser.escapedStringLiterals``
keeps the renderer's backslash escapes as characters, so a quoted value becomes another value;
ANSI mode decides whether a bad cast or an overflow fails or silently yields NULL or a wrapped
number; ``doubleQuotedIdentifiers`` turns a string into a column; ``caseSensitive`` and
``quotedRegexColumnNames`` change what a name resolves to; the time zone changes what a timestamp
literal means. The provider checks a statement (its partitions, its footprint, its lease) as the
renderer wrote it, so each of these is pinned to the value the renderer and the engine assume while
the provider's statements run, read back, and restored afterwards. A session that will not take a
setting (a Spark Connect server that fixes it) is refused before anything is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from airflow_delta_occ.exceptions import SessionSettingError
from airflow_delta_occ.jobs.text import refuse_substitution

STATEMENT_SETTINGS: Mapping[str, str] = {
    "spark.sql.variable.substitute": "false",
    "spark.sql.parser.escapedStringLiterals": "false",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.ansi.doubleQuotedIdentifiers": "false",
    "spark.sql.storeAssignmentPolicy": "ANSI",
    "spark.sql.caseSensitive": "false",
    "spark.sql.parser.quotedRegexColumnNames": "false",
    # The types of the literals an author writes: ``1e3`` a DOUBLE, ``1E+10BD`` a decimal of scale 0 or
    # more, ``CAST('ab' AS CHAR(3))`` a padded STRING (each legacy value changes a comparison's result).
    "spark.sql.legacy.exponentLiteralAsDecimal.enabled": "false",
    "spark.sql.legacy.allowNegativeScaleOfDecimal": "false",
    "spark.sql.preserveCharVarcharTypeInfo": "false",
    # The operator renders timestamp literals and typed partition values in UTC: the job reads them in
    # UTC in every mode (a Connect server or a cluster may default to another zone).
    "spark.sql.session.timeZone": "UTC",
}
"""Each setting that changes what SQL text means, and the value the provider's statements are rendered for."""


@contextlib.contextmanager
def pinned_settings(session: Any) -> Iterator[None]:
    """Run the block with ``STATEMENT_SETTINGS`` on ``session``; restore the session's own values after.

    Raises:
        SessionSettingError: the session refused a setting or kept another value, naming it.
    """
    previous: dict[str, str | None] = {}  # only what was changed, so only that is put back
    try:
        for key, wanted in STATEMENT_SETTINGS.items():
            current = _get(session, key)
            if current is not None and current.lower() == wanted.lower():
                continue  # Spark warns on every set or unset of a deprecated setting: touch none needlessly
            previous[key] = current
            try:
                session.conf.set(key, wanted)
            except Exception as exc:  # a Connect server's CANNOT_MODIFY_CONFIG, for one
                raise SessionSettingError(_refusal(key, previous[key], wanted, exc)) from exc
            kept = _get(session, key)
            if kept is None or kept.lower() != wanted.lower():
                raise SessionSettingError(_refusal(key, kept, wanted, None))
        yield
    finally:
        for key, value in previous.items():
            with contextlib.suppress(Exception):  # a stopped or killed session keeps nothing to restore
                if value is None:
                    session.conf.unset(key)
                else:
                    session.conf.set(key, value)


def _get(session: Any, key: str) -> str | None:
    """The session's value of ``key``, its default included (``conf.get(key, None)`` gives ``None`` for
    a setting never set); ``None`` when the session does not know the setting."""
    try:
        value = session.conf.get(key)
    except Exception:  # an unknown key on another Spark version
        return None
    return None if value is None else str(value)


def _refusal(key: str, kept: str | None, wanted: str, exc: Exception | None) -> str:
    reason = f": {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}" if exc is not None else ""
    return (f"the Spark session keeps {key}={kept} and would not take {key}={wanted}{reason}. The provider's "
            f"statements are rendered for {key}={wanted}; with another value Spark could run a statement other than "
            "the one checked, so nothing was run. Set it on the Spark Connect server or cluster, or let the session "
            "change it")


def run_sql(session: Any, text: str) -> Any:
    """``session.sql(text)`` for a statement the provider rendered, after the last check of its text.

    Callers hold ``pinned_settings`` on ``session``; the check refuses text Spark would rewrite even
    so (the settings are the first line, this the second).

    Raises:
        StatementTextError: the text holds ``${``.
    """
    refuse_substitution(text, "the statement")
    return session.sql(text)
