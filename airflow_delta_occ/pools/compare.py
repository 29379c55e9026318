"""Can two leased jobs conflict? The planner's verdict, made sound for jobs that run later than they were planned.

A footprint lists the files a job would read and rewrite *at the version it was planned at*. A lease
is about the future: the job reads the table when Spark starts, after other leased jobs may have
committed, and two footprints in a pool are often planned at different versions. File paths and
statistics do not survive that: a commit between plan and run can add a file both jobs select, or
rewrite one into another. Partitions and predicates do survive it. So before the planner judges a
pair, each footprint is lifted to partition level:

* every partition either footprint mentions (files read, files removed, partitions written, the
  partitions its filter pins) forms the pair's *known partitions*;
* a job that reads stands for every file, present or future, of each known partition its
  partition filter admits; a job that rewrites also removes and rewrites them all;
* when both jobs' filters leave a partition column open (a range, no filter, a whole-table read)
  and no column is pinned by both to values they do not share, they may meet in a partition
  neither knows yet: both then read and rewrite a shared unknown partition, and a rewrite may add
  files anywhere.

Lifting only adds files and partitions to a footprint, so a pair the planner calls conflicting
stays conflicting (``tests/unit/pools/test_compare.py`` checks this over every planner scenario),
and file-level precision (statistics) is given up. Delta's own append check already works on
partitions, which is why jobs confined to different partitions stay concurrent.

Table metadata can differ between the two plans (a property or schema change committed between
them): the pair is judged under each table state and conflicts if either says so. A different
partitioning (a replaced table) is always a conflict.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from airflow_delta_occ.engine.conflicts import PartitionSchema
from airflow_delta_occ.engine.expressions import TRUE, references, split_conjuncts
from airflow_delta_occ.engine.planner import (
    REWRITING_OPERATIONS,
    Footprint,
    Model,
    TableState,
    Verdict,
    can_conflict,
    enumerate_partitions,
    freeze_partition,
    partition_scoped,
    pinned_values,
    verdict,
)
from airflow_delta_occ.engine.predicates import comparison_key, evaluate_partition

Partition = tuple[tuple[str, str | None], ...]
UNKNOWN_PARTITION = "<a partition neither plan knows>"


@dataclass(frozen=True)
class PlannedJob:
    """A footprint with the table state it was planned at: what one lease request brings to a comparison."""

    footprint: Footprint
    table: TableState


def lease_verdict(a: PlannedJob, b: PlannedJob, model: Model) -> Verdict:
    """Whether ``a`` and ``b`` can conflict in either commit order, whenever each reads the table."""
    return _judged(a, b, model, lambda la, lb, state: can_conflict(la, lb, state, model), loser=a)


def order_verdict(winner: PlannedJob, loser: PlannedJob, model: Model) -> Verdict:
    """``lease_verdict`` for one commit order: whether ``loser`` fails when ``winner`` commits first (what a
    report names: the exception Delta would raise on which job)."""
    return _judged(winner, loser, model, lambda lw, ll, state: verdict(winner=lw, loser=ll, snapshot=state,
                                                                        model=model), loser=loser)


def _judged(a: PlannedJob, b: PlannedJob, model: Model,
            judge: Callable[[Footprint, Footprint, TableState], Verdict], *, loser: PlannedJob) -> Verdict:
    """``judge`` on the pair lifted to partitions, under each table state the two were planned at."""
    states = [a.table] if _same_state(a.table, b.table) else [a.table, b.table]
    if a.table.partition_columns != b.table.partition_columns:
        return Verdict(True, model, f"the table's partitioning changed between the plans of {a.footprint.label} "
                       f"(version {a.table.version}) and {b.footprint.label} (version {b.table.version})",
                       None, loser.footprint.label, (b if loser is a else a).footprint.label)
    last: Verdict | None = None
    for state in states:
        lifted_a, lifted_b = lift_pair(a.footprint, b.footprint, state)
        last = judge(lifted_a, lifted_b, state)
        if last.conflict:
            return last
    assert last is not None
    return last


@dataclass(frozen=True)
class Reach:
    """Which partitions a leased job can read or change, column by column, for indexing jobs by partition.

    ``layout`` is the table's partitioning (column names, physical names and types: a table replaced under
    column mapping has new physical names, and a lease comparison reads one plan's values under the other's
    names). ``columns`` holds, for each of its columns, the values the job's partitions can have there, as
    a filter compares them (``predicates.comparison_key`` of typed values and literals, so ``'2024-01-01'``
    written two ways is one value), or ``None`` where the job may touch any value; ``None`` for the whole reach when the
    job may touch any partition. Two jobs with the same layout are *apart* when some column has values
    on both sides, none of them NULL (a filter on a value is unknown, not false, on NULL, and a lease
    comparison keeps what is unknown), and they share none: they never conflict (``lease_verdict``, any
    model; ``tests/unit/pools/test_reach.py`` checks it over every planner scenario), so the arbiter does
    not compare them.
    """

    layout: tuple[tuple[str, str, str], ...]   # (logical name, physical name, type) per partition column
    columns: tuple[frozenset[Any] | None, ...] | None

    def apart(self, other: Reach) -> bool:
        """Whether the two jobs can share no partition (see the class docstring)."""
        if self.columns is None or other.columns is None or self.layout != other.layout:
            return False
        return any(a is not None and b is not None and None not in a and None not in b and a.isdisjoint(b)
                   for a, b in zip(self.columns, other.columns, strict=True))


def reach(job: PlannedJob, model: Model) -> Reach:
    """What ``job`` can touch, from its footprint as ``lift_pair`` lifts it.

    None of it when a rule that ignores partitions may apply (``planner.partition_scoped``), the job may
    write anywhere, or a partition value of its own does not parse (``lift_pair`` lets such a partition
    match any filter). Otherwise a column has values when the job reads nothing, or its filter has a
    conjunct on that column alone that pins it to a list (``pinned_values``; the conjunct
    ``_pinned_apart`` finds, so two readers apart here are apart there and never share a partition
    neither knows): the pinned values and the column's values in the job's own partitions (files read
    and removed, partitions written). A lifted footprint touches only partitions its filter admits and its
    own, so its values on such a column are among these.
    """
    schema = PartitionSchema.of(job.table.metadata)
    layout = tuple((name, physical, data_type.simple_string()) for name, physical, data_type in schema.fields)
    fp = job.footprint
    if not partition_scoped(fp, job.table, model) or (fp.adds_files and fp.write_partitions is None):
        return Reach(layout, None)
    own = []
    for partition in _partitions_of(fp):
        typed = schema.typed(dict(partition))
        if typed is None:
            return Reach(layout, None)
        own.append(typed)
    columns: list[frozenset[Any] | None] = []
    for name, _, _ in schema.fields:
        pins: list[Any] = []
        if fp.read_predicate is not None:
            conjunct = None if fp.read_whole_table else next(
                (c for c in split_conjuncts(fp.read_predicate) if pinned_values(c, name) is not None), None)
            if conjunct is None or references(conjunct) != {name}:
                columns.append(None)
                continue
            pins = list(pinned_values(conjunct, name) or ())   # literals of the column's type, as compared
            if any(v is None for v in pins):   # ``= NULL`` is never true, but a lease comparison keeps the unknown
                columns.append(None)
                continue
        try:
            columns.append(frozenset(comparison_key(v) for v in [*pins, *(p[name] for p in own)]))
        except TypeError:   # a value that cannot be hashed cannot be indexed
            columns.append(None)
    return Reach(layout, tuple(columns))


def compact(fp: Footprint) -> Footprint:
    """What a lease keeps of a footprint: one entry per partition instead of one per file.

    Lifting (``lift_pair``) looks only at the partitions of the files read and removed, so this loses
    nothing a lease comparison uses, and keeps a request small on a table of many files.
    """
    return replace(fp, read_files=_per_partition(fp.read_files.values()),
                   removes=_per_partition(fp.removes.values()))


def _per_partition(values: Iterable[Mapping[str, str | None]]) -> dict[str, dict[str, str | None]]:
    return {_file(p): dict(p) for p in sorted({freeze_partition(pv) for pv in values}, key=repr)}


def _same_state(x: TableState, y: TableState) -> bool:
    return x.metadata == y.metadata and x.protocol == y.protocol


def lift_pair(a: Footprint, b: Footprint, table: TableState) -> tuple[Footprint, Footprint]:
    """Both footprints at partition level over the partitions either knows (see the module docstring)."""
    schema = PartitionSchema.of(table.metadata)
    pinned_a, pinned_b = _pinned(a, schema), _pinned(b, schema)
    known = _partitions_of(a) | _partitions_of(b) | set(pinned_a or ()) | set(pinned_b or ())
    both_open = (_reads(a) and _reads(b) and pinned_a is None and pinned_b is None
                 and not _pinned_apart(a, b, schema))
    return _lift(a, schema, known, both_open), _lift(b, schema, known, both_open)


def _reads(fp: Footprint) -> bool:
    return fp.read_predicate is not None


def _pinned_apart(a: Footprint, b: Footprint, schema: PartitionSchema) -> bool:
    """Whether no partition, known or not, can be admitted by both filters.

    True when one filter pins a partition column to values and, for each of them, a conjunct of the
    other filter on that column alone is false (``country = 'DE'`` against ``country = 'FR'``;
    ``date = '2024-01-15'`` against ``date >= '2024-02-01'``), whatever the other columns hold.
    """
    if a.read_whole_table or b.read_whole_table or a.read_predicate is None or b.read_predicate is None:
        return False
    for name, _, _ in schema.fields:
        for pins, other in ((a.read_predicate, b.read_predicate), (b.read_predicate, a.read_predicate)):
            values = pinned_values(pins, name)
            if values is None:
                continue
            on_column = [c for c in split_conjuncts(other) if references(c) == {name}]
            if on_column and all(any(evaluate_partition(c, {name: v}) is False for c in on_column) for v in values):
                return True
    return False


def _pinned(fp: Footprint, schema: PartitionSchema) -> set[Partition] | None:
    """The partitions a reader's filter pins, or ``None`` when it leaves a column open."""
    if fp.read_predicate is None:
        return set()
    if fp.read_whole_table:
        return None
    listed = enumerate_partitions(fp.read_predicate, schema)
    return None if listed is None else {freeze_partition(p) for p in listed}


def _partitions_of(fp: Footprint) -> set[Partition]:
    values = [*fp.read_files.values(), *fp.removes.values(), *(fp.write_partitions or ())]
    return {freeze_partition(pv) for pv in values}


def _lift(fp: Footprint, schema: PartitionSchema, known: Iterable[Partition], both_open: bool) -> Footprint:
    if fp.read_predicate is None:
        return fp  # reads nothing, removes nothing: an append or a metadata change is already exact
    predicate = TRUE if fp.read_whole_table else fp.read_predicate
    admitted = sorted((p for p in known if _admits(predicate, schema, p)), key=repr)   # repr: NULL sorts beside values
    files = {_file(p): dict(p) for p in admitted}
    if both_open:
        files[UNKNOWN_PARTITION] = {}
    rewrites = fp.operation in REWRITING_OPERATIONS
    written = fp.write_partitions
    if rewrites and written is not None:
        written = None if both_open else _union(written, admitted)
    return replace(fp, read_files=files, removes=dict(files) if rewrites else {}, write_partitions=written)


def _admits(predicate: object, schema: PartitionSchema, partition: Partition) -> bool:
    """Whether a partition filter may select a partition; a value that does not parse may be selected."""
    typed = schema.typed(dict(partition))
    return typed is None or evaluate_partition(predicate, typed) is not False  # type: ignore[arg-type]


def _union(written: Iterable[Mapping[str, str | None]], more: Iterable[Partition]) -> tuple[dict[str, str | None], ...]:
    merged = {freeze_partition(pv) for pv in written} | set(more)
    return tuple(dict(p) for p in sorted(merged, key=repr))


def _file(partition: Partition) -> str:
    return "<every file of partition " + ",".join(f"{k}={v}" for k, v in partition) + ">"


class PairJudge:
    """``lease_verdict`` with a bounded memo: the arbiter compares the same pairs on every pass.

    Keys are caller-chosen (request id and revision), since a request's footprint never changes under one key.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._memo: OrderedDict[tuple[object, object, str], Verdict] = OrderedDict()

    def verdict(self, key_a: object, a: PlannedJob, key_b: object, b: PlannedJob, model: Model) -> Verdict:
        for key in ((key_a, key_b, model), (key_b, key_a, model)):   # a verdict covers both commit orders
            found = self._memo.get(key)
            if found is not None:
                self._memo.move_to_end(key)
                return found
        key = (key_a, key_b, model)
        try:
            result = lease_verdict(a, b, model)
        except Exception as exc:  # a footprint the checker cannot judge must never be granted beside another
            result = Verdict(True, model, f"could not compare {a.footprint.label} and {b.footprint.label}: {exc}",
                             None, a.footprint.label, b.footprint.label)
        self._memo[key] = result
        if len(self._memo) > self._capacity:
            self._memo.popitem(last=False)
        return result
