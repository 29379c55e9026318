"""Which files a running OPTIMIZE is certain to rewrite, read from the log as delta-spark picks them.

Early abort can stop a compaction only when it knows files the compaction rewrites: delta-spark's OPTIMIZE
records exactly those files as read (``txn.trackFilesRead``), and it commits again after a conflict as long as
every one of them is still in the table (``OptimizeExecutor.commitAndRetry``): only the loss of a file it
rewrites fails it. Which files it rewrites is its bin packing (delta-spark 4.4,
``OptimizeTableCommand.scala``), for the files of the partitions its filter selects:

* **Compaction** selects the files smaller than ``optimize.minFileSize``, and the files whose deletion vector
  removed more than ``optimize.maxDeletedRowsRatio`` of their rows (or that have a deletion vector and no row
  count). Per partition, sorted by size, it fills bins up to ``optimize.maxFileSize`` and drops every bin of a
  single file.
* **Z-ordering** selects every file, and puts each partition's files into one bin that is always rewritten.

This module answers only where that answer cannot depend on what the log does not say:

* a partition's files are grouped by their partition values as written (the finest grouping delta-spark can
  use); the bin bound is checked over a coarser grouping (typed values, timestamp and FLOAT columns left out,
  since delta-spark may merge partitions written differently: in the session's time zone, at 32 bits), so a
  partition whose candidates may
  exceed ``maxFileSize`` is never counted: its bins, and which of them hold one file, depend on sizes sorted
  against files it may merge with;
* a compaction file is certain only when it is smaller than ``minFileSize``; one selected for its deleted rows
  may or may not be (counted towards the bound, never as certain); its partition needs two certain files;
* a table with liquid clustering (another strategy), an OPTIMIZE in batches (``optimize.batchSize``: one commit
  per batch) and a file whose partition values the engine cannot type all make the answer "nothing certain".
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .actions import AddFile, FileKey
from .conflicts import PartitionSchema
from .errors import InvalidCommitError
from .expressions import TRUE, Expr
from .predicates import evaluate_partition
from .schema import PrimitiveType
from .snapshot import Snapshot
from .stats import parse_stats_of

MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
MAX_FILE_SIZE_CONF = "spark.databricks.delta.optimize.maxFileSize"
MAX_DELETED_ROWS_RATIO_CONF = "spark.databricks.delta.optimize.maxDeletedRowsRatio"
BATCH_SIZE_CONF = "spark.databricks.delta.optimize.batchSize"
CLUSTERING_FEATURE = "clustering"

_GIB = 1024 * 1024 * 1024
_LEFT_OUT_TYPES = frozenset({"timestamp", "timestamp_ntz", "float"})   # grouped by delta-spark otherwise than here


@dataclass(frozen=True)
class CompactionSettings:
    """The session settings delta-spark's OPTIMIZE picks files by (its defaults in delta-spark 4.4)."""

    min_file_size: int = _GIB
    max_file_size: int = _GIB
    max_deleted_rows_ratio: float = 0.05
    batched: bool = False   # ``optimize.batchSize`` is set: one commit per batch of bins

    @classmethod
    def from_conf(cls, get: Callable[[str], str | None]) -> CompactionSettings:
        """The settings from a session's configuration (``get`` returns ``None`` for a key not set).

        Raises:
            InvalidCommitError: a value delta-spark would not accept either.
        """
        def number(key: str, default: int) -> int:
            text = get(key)
            if text is None or not str(text).strip():
                return default
            try:
                value = int(str(text).strip())
            except ValueError as exc:
                raise InvalidCommitError(f"{key}={text!r} is not a whole number of bytes") from exc
            if value < 0:
                raise InvalidCommitError(f"{key}={text!r} is negative")
            return value

        ratio_text = get(MAX_DELETED_ROWS_RATIO_CONF)
        ratio = cls.max_deleted_rows_ratio
        if ratio_text is not None and str(ratio_text).strip():
            try:
                ratio = float(str(ratio_text).strip())
            except ValueError as exc:
                raise InvalidCommitError(f"{MAX_DELETED_ROWS_RATIO_CONF}={ratio_text!r} is not a number") from exc
            if not 0.0 <= ratio <= 1.0:
                raise InvalidCommitError(f"{MAX_DELETED_ROWS_RATIO_CONF}={ratio_text!r} is not in [0, 1]")
        batch = get(BATCH_SIZE_CONF)
        return cls(min_file_size=number(MIN_FILE_SIZE_CONF, _GIB), max_file_size=number(MAX_FILE_SIZE_CONF, _GIB),
                   max_deleted_rows_ratio=ratio, batched=batch is not None and bool(str(batch).strip()))


@dataclass(frozen=True)
class CompactionPlan:
    """What an OPTIMIZE is certain to do at one version: the files it surely rewrites, and whether it surely
    commits (a rewritten file holds a row, so a new file is written)."""

    files: tuple[AddFile, ...] = ()
    commits: bool = False
    why_not: str = ""   # when nothing is certain: why

    @property
    def keys(self) -> frozenset[FileKey]:
        return frozenset(f.key for f in self.files)


def surely_compacted(snapshot: Snapshot, read_predicate: Expr | None, settings: CompactionSettings, *,
                     zorder: bool) -> CompactionPlan:
    """The files an OPTIMIZE (Z-ordered or not) filtering on the partition predicate ``read_predicate`` (bound,
    partition columns only; ``None`` or ``TRUE``: the whole table) is certain to rewrite at ``snapshot``."""
    features = (snapshot.protocol.writer_features or frozenset()) | (snapshot.protocol.reader_features or frozenset())
    if CLUSTERING_FEATURE in features:
        return CompactionPlan(why_not="the table is clustered (liquid clustering picks files otherwise)")
    if settings.batched:
        return CompactionPlan(why_not=f"{BATCH_SIZE_CONF} is set (one commit per batch)")
    if zorder and settings.max_file_size == 0:   # delta-spark divides by it when it Z-orders: the job fails
        return CompactionPlan(why_not=f"{MAX_FILE_SIZE_CONF} is 0")
    schema = PartitionSchema.of(snapshot.metadata)
    predicate = read_predicate if read_predicate is not None else TRUE
    certain: dict[tuple[str | None, ...], list[AddFile]] = defaultdict(list)   # by partition values as written
    bound: dict[tuple[object, ...], int] = defaultdict(int)                     # by a coarser grouping
    groups: dict[tuple[str | None, ...], tuple[object, ...]] = {}
    for add in snapshot.files():
        typed = schema.typed(add.partition_values)
        if typed is None:
            return CompactionPlan(why_not=f"the partition values of {add.path} do not parse as the table's types")
        selected = True if predicate == TRUE else evaluate_partition(predicate, typed)
        if selected is False:
            continue
        raw = tuple(add.partition_values.get(physical) for _, physical, _ in schema.fields)
        coarse = _coarse_key(schema, typed)
        groups[raw] = coarse
        if zorder:
            if selected is True:
                certain[raw].append(add)
            continue
        small = add.size < settings.min_file_size
        if small or add.deletion_vector is not None:   # selected, or maybe (for its deleted rows)
            bound[coarse] += add.size
        if small and selected is True:
            certain[raw].append(add)
    files: list[AddFile] = []
    for raw, members in certain.items():
        if zorder or (len(members) >= 2 and bound[groups[raw]] <= settings.max_file_size):
            files.extend(members)
    if not files:
        return CompactionPlan(why_not="no file is certain to be rewritten (no partition has two small files that "
                                      "fit one bin)" if not zorder else "no file is selected")
    return CompactionPlan(files=tuple(files), commits=any(_holds_a_row(f) for f in files))


def _coarse_key(schema: PartitionSchema, typed: Mapping[str, object]) -> tuple[object, ...]:
    """A grouping of partitions no finer than delta-spark's: typed values (NULL and ``""`` alike, every NaN one
    value, ``-0.0`` as ``0.0``), with time columns left out (their values are normalised in the session's zone)
    and FLOAT ones too (delta-spark casts to 32 bits: ``0.1`` and ``0.10000000149011612`` are one partition
    there, two doubles here)."""
    key: list[object] = []
    for name, _, data_type in schema.fields:
        if isinstance(data_type, PrimitiveType) and data_type.name in _LEFT_OUT_TYPES:
            continue
        value = typed.get(name)
        if isinstance(value, float):
            value = "NaN" if math.isnan(value) else value + 0.0
        key.append(value)
    return tuple(key)


def _holds_a_row(add: AddFile) -> bool:
    stats = parse_stats_of(add.stats, ())
    if stats is None or stats.num_records is None:
        return False
    deleted = add.deletion_vector.cardinality if add.deletion_vector is not None else 0
    return stats.num_records - deleted > 0


__all__ = ["BATCH_SIZE_CONF", "MAX_DELETED_ROWS_RATIO_CONF", "MAX_FILE_SIZE_CONF", "MIN_FILE_SIZE_CONF",
           "CompactionPlan", "CompactionSettings", "surely_compacted"]
