"""The job vocabulary: what a job does (``JobOperation``) and what each MERGE clause does (``ClauseKind``).

One enum each, with what the rest of the provider needs to know about a value as its properties:
the planner's operation, the name Delta gives the commit, the SQL a clause starts with, whether it
takes a ``set`` mapping, whether it writes source rows. A new operation or clause kind is added here
and nowhere else. Both are ``StrEnum``: a value is its JSON and XCom spelling.
"""

from __future__ import annotations

from enum import StrEnum


class JobOperation(StrEnum):
    """A Delta job of the provider's operators."""

    MERGE = "merge"
    UPDATE = "update"
    DELETE = "delete"
    OPTIMIZE = "optimize"
    APPEND = "append"
    OVERWRITE_PARTITIONS = "overwrite_partitions"

    @property
    def reads_source(self) -> bool:
        """It reads rows from a source (and, under ``partitions=``, checks where they land)."""
        return self in (JobOperation.MERGE, JobOperation.APPEND, JobOperation.OVERWRITE_PARTITIONS)

    @property
    def is_write(self) -> bool:
        """A DataFrame write (append, ``replaceWhere``), not a SQL statement; it always commits."""
        return self in (JobOperation.APPEND, JobOperation.OVERWRITE_PARTITIONS)

    @property
    def runs_its_partition_filter(self) -> bool:
        """Its condition is exactly its partition filter (OPTIMIZE WHERE, ``replaceWhere``)."""
        return self in (JobOperation.OPTIMIZE, JobOperation.OVERWRITE_PARTITIONS)

    @property
    def engine_name(self) -> str:
        """The planner's operation (``engine.planner.Operation``); Z-ordering is its own, see ``jobs.footprint``."""
        return _ENGINE_NAMES[self]

    @property
    def delta_name(self) -> str:
        """Delta's name of the commit the job makes (``commitInfo.operation``); DataFrame writes are WRITE."""
        return _DELTA_NAMES[self]


_ENGINE_NAMES = {
    JobOperation.MERGE: "MERGE", JobOperation.UPDATE: "UPDATE", JobOperation.DELETE: "DELETE",
    JobOperation.OPTIMIZE: "OPTIMIZE", JobOperation.APPEND: "INSERT",
    JobOperation.OVERWRITE_PARTITIONS: "REPLACE_WHERE",
}
_DELTA_NAMES = {
    JobOperation.MERGE: "MERGE", JobOperation.UPDATE: "UPDATE", JobOperation.DELETE: "DELETE",
    JobOperation.OPTIMIZE: "OPTIMIZE", JobOperation.APPEND: "WRITE", JobOperation.OVERWRITE_PARTITIONS: "WRITE",
}


class ClauseScope(StrEnum):
    """Which rows a MERGE clause applies to; the value is its kind's prefix."""

    MATCHED = "matched"
    NOT_MATCHED = "not_matched"
    NOT_MATCHED_BY_SOURCE = "not_matched_by_source"

    @property
    def when(self) -> str:
        return {ClauseScope.MATCHED: "WHEN MATCHED", ClauseScope.NOT_MATCHED: "WHEN NOT MATCHED",
                ClauseScope.NOT_MATCHED_BY_SOURCE: "WHEN NOT MATCHED BY SOURCE"}[self]


class ClauseKind(StrEnum):
    """One WHEN clause of a MERGE: its scope, then its action."""

    MATCHED_UPDATE = "matched_update"
    MATCHED_UPDATE_ALL = "matched_update_all"
    MATCHED_DELETE = "matched_delete"
    NOT_MATCHED_INSERT = "not_matched_insert"
    NOT_MATCHED_INSERT_ALL = "not_matched_insert_all"
    NOT_MATCHED_BY_SOURCE_UPDATE = "not_matched_by_source_update"
    NOT_MATCHED_BY_SOURCE_DELETE = "not_matched_by_source_delete"

    @property
    def scope(self) -> ClauseScope:
        return next(s for s in (ClauseScope.NOT_MATCHED_BY_SOURCE, ClauseScope.NOT_MATCHED, ClauseScope.MATCHED)
                    if self.value.startswith(s.value + "_"))

    @property
    def action(self) -> str:
        """``update``, ``update_all``, ``delete``, ``insert`` or ``insert_all``."""
        return self.value[len(self.scope.value) + 1:]

    @property
    def by_source(self) -> bool:
        """It applies to target rows the source does not match: in every partition, unless confined."""
        return self.scope is ClauseScope.NOT_MATCHED_BY_SOURCE

    @property
    def takes_set(self) -> bool:
        """It needs a non-empty ``set`` mapping (and every other kind refuses one)."""
        return self.action in ("update", "insert")

    @property
    def copies_source_row(self) -> bool:
        """It writes a source row as it is (``UPDATE SET *``, ``INSERT *``): the row's partition values."""
        return self in (ClauseKind.MATCHED_UPDATE_ALL, ClauseKind.NOT_MATCHED_INSERT_ALL)

    @property
    def writes_source_rows(self) -> bool:
        """The rows it writes come from the source: checked to land inside ``partitions=``."""
        return self.copies_source_row or self is ClauseKind.NOT_MATCHED_INSERT
