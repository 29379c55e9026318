"""``JobSpec``: everything a Delta job needs, as plain JSON, from the Airflow worker to the Spark runner.

The operator validates and renders everything it can before Spark starts (partition literals typed
by the table's schema, conditions checked by the engine's SQL parser); the runner only executes.
Keeping the spec plain data means the same runner serves an embedded session, ``spark-submit`` to a
cluster and Spark Connect, and a spec can be logged, stored and replayed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .exceptions import JobSpecError

OPERATIONS = ("merge", "update", "delete", "optimize", "append", "overwrite_partitions")


@dataclass(frozen=True)
class TableRef:
    """A Delta table by path/URI or by catalog name (exactly one)."""

    path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.name is None):
            raise JobSpecError("a table is given by exactly one of path or name")

    @property
    def label(self) -> str:
        return self.path or self.name or ""


@dataclass(frozen=True)
class SourceRef:
    """Where a MERGE or a writer reads its rows: a path (with format), a table name or a SQL query."""

    path: str | None = None
    format: str = "delta"
    table: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.path, self.table, self.query)) != 1:
            raise JobSpecError("a source is given by exactly one of path, table or query")
        if self.query is not None:
            from .queries import check_source_query

            check_source_query(self.query)


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause. ``kind``: matched_update, matched_update_all, matched_delete, not_matched_insert,
    not_matched_insert_all, not_matched_by_source_update, not_matched_by_source_delete."""

    kind: str
    condition: str | None = None
    set: Mapping[str, str] = field(default_factory=dict)

    KINDS = ("matched_update", "matched_update_all", "matched_delete", "not_matched_insert",
             "not_matched_insert_all", "not_matched_by_source_update", "not_matched_by_source_delete")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise JobSpecError(f"unknown merge clause {self.kind!r}; expected one of {', '.join(self.KINDS)}")
        needs_set = self.kind in ("matched_update", "not_matched_insert", "not_matched_by_source_update")
        if needs_set and not self.set:
            raise JobSpecError(f"merge clause {self.kind} needs a non-empty set mapping")


@dataclass(frozen=True)
class RunIdentity:
    """The Airflow run a commit belongs to; written into commitInfo.userMetadata and used as txnAppId."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1

    @property
    def app_id(self) -> str:
        # One id per task run: a retry of the same run (an ambiguous failure) is recognised as already
        # committed, while other runs (backfills in any order) are independent.
        return f"airflow:{self.dag_id}/{self.task_id}/{self.run_id}/{self.map_index}"

    def tagged(self, user_metadata: str | None) -> bool:
        """Whether a commit's userMetadata names this task run (any try)."""
        try:
            tag = json.loads(user_metadata or "")["airflow"]
        except (ValueError, KeyError, TypeError):
            return False
        return isinstance(tag, dict) and (tag.get("dag_id"), tag.get("task_id"), tag.get("run_id"),
                                          tag.get("map_index")) == (self.dag_id, self.task_id, self.run_id,
                                                                    self.map_index)

    def user_metadata(self) -> str:
        return json.dumps({"airflow": {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": self.run_id,
                                       "map_index": self.map_index, "try_number": self.try_number}},
                          sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class JobSpec:
    """A fully rendered Delta job. ``condition`` already holds the injected partition predicate."""

    operation: str
    target: TableRef
    run: RunIdentity
    source: SourceRef | None = None
    condition: str | None = None                       # MERGE ON / UPDATE, DELETE WHERE / OPTIMIZE WHERE
    partition_filter: str | None = None                # the injected part alone (also replaceWhere)
    set: Mapping[str, str] = field(default_factory=dict)
    clauses: tuple[MergeClause, ...] = ()
    zorder_by: tuple[str, ...] = ()
    target_alias: str = "t"
    source_alias: str = "s"
    retry_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    idempotent: bool = True
    # Rows of the source must write inside the partitions: ``source_check`` is TRUE for a source row
    # (under ``source_alias``) that does; ``source_values`` are the partition values a row writes
    # (shown for offending rows); ``source_outside`` says whether others fail the job or are dropped.
    source_check: str | None = None
    source_values: Mapping[str, str] = field(default_factory=dict)
    source_outside: str = "fail"

    def __post_init__(self) -> None:
        if self.operation not in OPERATIONS:
            raise JobSpecError(f"unknown operation {self.operation!r}; expected one of {', '.join(OPERATIONS)}")
        if self.operation in ("merge", "append", "overwrite_partitions") and self.source is None:
            raise JobSpecError(f"{self.operation} needs a source")
        if self.operation == "merge" and (not self.condition or not self.clauses):
            raise JobSpecError("merge needs a condition and at least one clause")
        if self.operation == "update" and not self.set:
            raise JobSpecError("update needs a set mapping")
        if self.operation == "overwrite_partitions" and not self.partition_filter:
            raise JobSpecError("overwrite_partitions needs partitions (it becomes replaceWhere)")
        if self.source_outside not in ("fail", "drop"):
            raise JobSpecError(f"source_outside must be 'fail' or 'drop', got {self.source_outside!r}")
        if self.source_check is not None and self.source is None:
            raise JobSpecError("source_check needs a source")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise TypeError("a JobSpec is a JSON object")
            return cls(
                operation=d["operation"], target=TableRef(**d["target"]), run=RunIdentity(**d["run"]),
                source=SourceRef(**d["source"]) if d.get("source") else None, condition=d.get("condition"),
                partition_filter=d.get("partition_filter"), set=d.get("set") or {},
                clauses=tuple(MergeClause(**c) for c in d.get("clauses") or ()),
                zorder_by=tuple(d.get("zorder_by") or ()), target_alias=d.get("target_alias", "t"),
                source_alias=d.get("source_alias", "s"), retry_policies=d.get("retry_policies") or {},
                idempotent=d.get("idempotent", True), source_check=d.get("source_check"),
                source_values=d.get("source_values") or {}, source_outside=d.get("source_outside", "fail"),
            )
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
            raise JobSpecError(f"not a valid JobSpec: {exc}") from exc
