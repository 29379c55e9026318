"""``JobSpec``: everything a Delta job needs, typed, with a JSON form, from the Airflow worker to the runner.

The operator validates and renders everything it can before Spark starts (partition values typed
by the table's schema, conditions parsed completely by the engine's SQL parser); the runner only
executes. The spec carries structure, not only SQL text: the job's condition and its partition
predicate are parse trees (the runner renders the statement from them), and ``partitions`` holds
the typed partition values, so a planner footprint is a pure function of (spec, snapshot) and a
lease or a trigger can carry the spec as JSON. The same runner serves an embedded session,
``spark-submit`` to a cluster and Spark Connect, and a spec can be logged, stored and replayed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_delta_occ.engine.errors import PredicateError
from airflow_delta_occ.engine.expr_json import expr_from_json, expr_to_json
from airflow_delta_occ.engine.expressions import Expr, references, split_conjuncts
from airflow_delta_occ.engine.sql_parser import to_sql
from airflow_delta_occ.exceptions import JobSpecError

from .operations import ClauseKind, JobOperation
from .partitions import canonical_tree
from .text import refuse_substitution


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


# A Spark data source: a short name (``delta``, ``parquet``) or a class name (``org.apache...AvroFileFormat``).
_DATA_SOURCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def check_source_format(value: object, what: str = "source_format") -> None:
    """``value`` names a Spark data source (a short name or a class name), nothing else: it is checked where
    it enters (the operator's argument, and once rendered, the spec), since a template may have made it.

    Raises:
        JobSpecError: not text, or not a data source's name; the message names ``what``.
    """
    if not isinstance(value, str) or _DATA_SOURCE.fullmatch(value) is None:
        raise JobSpecError(f"{what} must name a Spark data source (such as delta, parquet, json or a class name), "
                           f"got {value!r:.80}")


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
        check_source_format(self.format, "the source's format")
        if self.query is not None:
            from .queries import check_source_query

            check_source_query(self.query)


@dataclass(frozen=True)
class MergeClause:
    """One WHEN clause (``kind``: a ``ClauseKind`` or its value): its extra condition and the values
    it sets, by column, as parse trees."""

    kind: ClauseKind
    condition: Expr | None = None
    set: Mapping[str, Expr] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", ClauseKind(self.kind))
        except ValueError:
            raise JobSpecError(f"unknown merge clause {self.kind!r}; expected one of "
                               f"{', '.join(ClauseKind)}") from None
        if self.kind.takes_set and not self.set:
            raise JobSpecError(f"merge clause {self.kind} needs a non-empty set mapping")


TXN_VERSION = 0
"""The ``txnVersion`` of an idempotent job's writes (its ``txnAppId`` is the run's ``app_id``): each task run
writes at most once per app id, so version 0 is enough, and Delta skips a write whose app id the table already
holds at this version or later."""


USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
COMMIT_IDENTITY_CONFS = (USER_METADATA_CONF, TXN_APP_ID_CONF, TXN_VERSION_CONF)
"""Spark settings that name a job's commits, which the runner sets for each attempt from the task run.

A ``spark_conf`` that sets one is refused: its ``userMetadata`` would be replaced without a word, and its
``txnAppId``/``txnVersion`` would make Delta skip a write the provider believes it makes (early abort, the
commit check and the retry of a re-run all read the run's own id)."""


def commit_identity_confs(conf: Mapping[str, Any]) -> list[str]:
    """The keys of ``conf`` that are the runner's commit identity (``COMMIT_IDENTITY_CONFS``), sorted."""
    return sorted(key for key in conf if isinstance(key, str) and key.strip() in COMMIT_IDENTITY_CONFS)


@dataclass(frozen=True)
class RunIdentity:
    """The Airflow task run a commit belongs to; written into commitInfo.userMetadata and used as txnAppId.

    ``first_try`` is the first try number since the task instance was last cleared (Airflow keeps
    ``max_tries - retries + 1``; it is 1 until the first clear). Retries of one series share the
    application id, so a retry after a commit the task never saw confirmed writes nothing; a
    deliberate clear starts a new series, whose id is new, so it redoes the work.
    """

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1
    first_try: int = 1

    @property
    def app_id(self) -> str:
        # One id per series of tries of a task run: retries are recognised as already committed,
        # while a clear and other runs (backfills in any order) are independent.
        series = f"/{self.first_try}" if self.first_try != 1 else ""
        return f"airflow:{self.dag_id}/{self.task_id}/{self.run_id}/{self.map_index}{series}"

    def tagged(self, user_metadata: str | None) -> bool:
        """Whether a commit's userMetadata names this series of tries of the task run (any try in it)."""
        try:
            tag = json.loads(user_metadata or "")["airflow"]
        except (ValueError, KeyError, TypeError):
            return False
        return isinstance(tag, dict) and (tag.get("dag_id"), tag.get("task_id"), tag.get("run_id"),
                                          tag.get("map_index"), tag.get("first_try", 1)) == (
            self.dag_id, self.task_id, self.run_id, self.map_index, self.first_try)

    def user_metadata(self) -> str:
        return json.dumps({"airflow": {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": self.run_id,
                                       "map_index": self.map_index, "try_number": self.try_number,
                                       "first_try": self.first_try}},
                          sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class JobSpec:
    """A fully rendered Delta job.

    ``condition`` (MERGE ON / UPDATE, DELETE WHERE / OPTIMIZE WHERE) already holds the injected
    partition predicate as a top-level conjunct; ``partition_filter`` is that predicate alone (also
    the overwrite's ``replaceWhere``); ``partitions`` are its values as Delta serializes partition
    values (``None``: the NULL partition), by partition column.
    """

    operation: JobOperation
    target: TableRef
    run: RunIdentity
    source: SourceRef | None = None
    condition: Expr | None = None
    partition_filter: Expr | None = None
    partitions: Mapping[str, tuple[str | None, ...]] = field(default_factory=dict)
    set: Mapping[str, Expr] = field(default_factory=dict)
    clauses: tuple[MergeClause, ...] = ()
    zorder_by: tuple[str, ...] = ()
    target_alias: str = "t"
    source_alias: str = "s"
    retry_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    idempotent: bool = True
    # Rows of the source must write inside the partitions: ``source_check`` is TRUE for a source row
    # (under ``source_alias``) that does; ``source_values`` are the partition values a row writes
    # (shown for offending rows); ``source_outside`` says whether others fail the job or are dropped.
    source_check: Expr | None = None
    source_values: Mapping[str, Expr] = field(default_factory=dict)
    source_outside: str = "fail"
    # The table version the job was planned at (the worker's snapshot). A commit of this task run after
    # it is this try's; before it, an earlier try's. Without it the runner reads the version first.
    planned_version: int | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "operation", JobOperation(self.operation))
        except ValueError:
            raise JobSpecError(f"unknown operation {self.operation!r}; expected one of "
                               f"{', '.join(JobOperation)}") from None
        if self.operation.reads_source and self.source is None:
            raise JobSpecError(f"{self.operation} needs a source")
        if self.operation == "merge" and (self.condition is None or not self.clauses):
            raise JobSpecError("merge needs a condition and at least one clause")
        if self.operation == "update" and not self.set:
            raise JobSpecError("update needs a set mapping")
        if self.operation == "overwrite_partitions" and self.partition_filter is None:
            raise JobSpecError("overwrite_partitions needs partitions (it becomes replaceWhere)")
        if self.source_outside not in ("fail", "drop"):
            raise JobSpecError(f"source_outside must be 'fail' or 'drop', got {self.source_outside!r}")
        if self.source_check is not None and self.source is None:
            raise JobSpecError("source_check needs a source")
        if bool(self.partitions) != (self.partition_filter is not None):
            raise JobSpecError("partitions and partition_filter go together")
        for what, text in self._statement_texts():  # first: canonical_tree parses the rendered text
            refuse_substitution(text, what)
        self._canonicalize()
        self._check_confined()

    def _canonicalize(self) -> None:
        """Every tree becomes the tree of exactly the SQL the runner will execute (``canonical_tree``).

        However a spec was built (the operators, a subclass's ``build_spec``, ``from_json``), the
        footprint planned from its trees and the statement rendered from them describe one statement;
        a tree whose rendering does not parse back to itself is refused here.
        """
        def canon(tree: Expr | None, what: str) -> Expr | None:
            return canonical_tree(tree, what) if tree is not None else None

        def canon_all(trees: Mapping[str, Expr], what: str) -> dict[str, Expr]:
            return {key: canonical_tree(tree, f"{what}[{key}]") for key, tree in trees.items()}

        for what in ("condition", "partition_filter", "source_check"):
            object.__setattr__(self, what, canon(getattr(self, what), what))
        object.__setattr__(self, "set", canon_all(self.set, "set"))
        object.__setattr__(self, "source_values", canon_all(self.source_values, "source_values"))
        object.__setattr__(self, "clauses", tuple(
            MergeClause(c.kind, canon(c.condition, f"clauses[{i}].condition"), canon_all(c.set, f"clauses[{i}].set"))
            for i, c in enumerate(self.clauses)))

    def trees(self) -> Iterator[tuple[str, Expr]]:
        """Every expression of the spec, by what it is (as messages name it)."""
        for what in ("condition", "partition_filter", "source_check"):
            tree = getattr(self, what)
            if tree is not None:
                yield what, tree
        for key, tree in self.set.items():
            yield f"set[{key}]", tree
        for i, clause in enumerate(self.clauses):
            if clause.condition is not None:
                yield f"clauses[{i}].condition", clause.condition
            for key, tree in clause.set.items():
                yield f"clauses[{i}].set[{key}]", tree
        for key, tree in self.source_values.items():
            yield f"source_values[{key}]", tree

    def _statement_texts(self) -> Iterator[tuple[str, object]]:
        """Every value of the spec that the runner puts into statement text, by what it is."""
        yield "table", self.target.label
        if self.source is not None:
            yield "source", [v for v in (self.source.path, self.source.table, self.source.query) if v is not None]
        for what, tree in self.trees():
            yield what, to_sql(tree)
        yield "set", list(self.set)   # the column names become statement text too
        for i, clause in enumerate(self.clauses):
            yield f"clauses[{i}].set", list(clause.set)
        yield "source_values", list(self.source_values)
        yield "zorder_by", list(self.zorder_by)
        yield "target_alias", self.target_alias
        yield "source_alias", self.source_alias

    def _check_confined(self) -> None:
        """The partition predicate is what ``partitions`` says, and it confines the job as a whole.

        Every conjunct of ``partition_filter`` is a top-level conjunct of ``condition`` (MERGE ON,
        UPDATE/DELETE WHERE), or the condition itself (OPTIMIZE WHERE, replaceWhere); source rows are
        checked whenever a source writes under ``partitions``. A spec that breaks this, decoded from
        JSON or built by hand, would run a statement its footprint does not describe.
        """
        if self.partition_filter is None:
            return
        names = {c.lower() for c in references(self.partition_filter)}
        if names != {c.lower() for c in self.partitions}:
            raise JobSpecError(f"partition_filter names {sorted(names)}, partitions names {sorted(self.partitions)}")
        alias = self.target_alias if self.operation == "merge" else None
        if self.operation.runs_its_partition_filter:
            if self.condition is not None and to_sql(self.condition) != to_sql(self.partition_filter):
                raise JobSpecError(f"{self.operation} runs exactly its partition filter; condition differs from it")
        elif self.operation is not JobOperation.APPEND:
            conjuncts = {to_sql(c, qualifier=alias) for c in split_conjuncts(self.condition)} \
                if self.condition is not None else set()
            missing = [c for c in split_conjuncts(self.partition_filter) if to_sql(c, qualifier=alias) not in conjuncts]
            if missing:
                raise JobSpecError("the partition predicate is not a top-level conjunct of the condition: "
                                   + ", ".join(to_sql(c) for c in missing))
        for i, clause in enumerate(self.clauses):
            # Every row of another partition is "not matched by source": such a clause carries the predicate too.
            if clause.kind.by_source:
                _check_carries(clause.condition, self.partition_filter, alias, f"clauses[{i}] ({clause.kind})")
        writes_source = self.operation.is_write or any(c.kind.writes_source_rows for c in self.clauses)
        if writes_source and self.source_check is None:
            raise JobSpecError("a job that writes source rows under partitions needs source_check")

    @property
    def condition_sql(self) -> str | None:
        """The condition as Spark SQL, rendered from its tree."""
        return to_sql(self.condition) if self.condition is not None else None

    @property
    def partition_filter_sql(self) -> str | None:
        return to_sql(self.partition_filter) if self.partition_filter is not None else None

    def to_json(self) -> str:
        """The spec as JSON: every expression in ``expr_to_json``'s form (trees, never SQL text)."""
        data = asdict(self)
        for key in ("condition", "partition_filter", "source_check"):
            data[key] = _tree_json(getattr(self, key))
        data["set"] = _trees_json(self.set)
        data["source_values"] = _trees_json(self.source_values)
        data["clauses"] = [{"kind": c.kind.value, "condition": _tree_json(c.condition), "set": _trees_json(c.set)}
                           for c in self.clauses]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        """Decode a spec that crossed a process boundary (spark-submit); it passes every check of
        ``__post_init__``, as a spec built in the worker does.

        Raises:
            JobSpecError: not a valid JobSpec (the message names the part).
        """
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise TypeError("a JobSpec is a JSON object")
            trees = {key: _tree(d.get(key)) for key in ("condition", "partition_filter", "source_check")}
            clauses = []
            for i, c in enumerate(d.get("clauses") or ()):
                if not isinstance(c, dict) or set(c) - {"kind", "condition", "set"}:
                    raise TypeError(f"clauses[{i}] is not a merge clause")
                condition = _tree(c.get("condition"))
                clauses.append(MergeClause(kind=c["kind"], condition=condition, set=_trees(c.get("set"),
                                                                                          f"clauses[{i}].set")))
            return cls(
                operation=d["operation"], target=TableRef(**d["target"]), run=RunIdentity(**d["run"]),
                source=SourceRef(**d["source"]) if d.get("source") else None, **trees,
                partitions={str(k): tuple(v) for k, v in (d.get("partitions") or {}).items()},
                set=_trees(d.get("set"), "set"), clauses=tuple(clauses),
                zorder_by=tuple(d.get("zorder_by") or ()), target_alias=d.get("target_alias", "t"),
                source_alias=d.get("source_alias", "s"), retry_policies=d.get("retry_policies") or {},
                idempotent=d.get("idempotent", True), source_values=_trees(d.get("source_values"), "source_values"),
                source_outside=d.get("source_outside", "fail"), planned_version=_version(d.get("planned_version")),
            )
        except (KeyError, TypeError, AttributeError, ValueError, RecursionError, PredicateError) as exc:
            raise JobSpecError(f"not a valid JobSpec: {exc}") from exc


def _version(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"planned_version must be a table version (an integer >= 0), not {value!r}")
    return value


def _check_carries(condition: Expr | None, predicate: Expr, alias: str | None, what: str) -> None:
    """``condition`` has every conjunct of ``predicate`` among its top-level conjuncts."""
    held = {to_sql(c, qualifier=alias) for c in split_conjuncts(condition)} if condition is not None else set()
    missing = [c for c in split_conjuncts(predicate) if to_sql(c, qualifier=alias) not in held]
    if missing:
        raise JobSpecError(f"{what} does not carry the partition predicate as a top-level conjunct (it would apply to "
                           "every row of every other partition): " + ", ".join(to_sql(c) for c in missing))


def _tree_json(tree: Expr | None) -> dict[str, Any] | None:
    return expr_to_json(tree) if tree is not None else None


def _trees_json(trees: Mapping[str, Expr]) -> dict[str, Any]:
    return {key: expr_to_json(tree) for key, tree in trees.items()}


def _tree(data: object) -> Expr | None:
    """A decoded tree (``__post_init__`` checks it is the tree of its own rendering)."""
    return expr_from_json(data) if data is not None else None


def _trees(data: object, what: str) -> dict[str, Expr]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TypeError(f"{what} is not a mapping of column to expression")
    return {str(key): expr_from_json(value) for key, value in data.items()}
