"""A checkpoint's add rows as a columnar file table: Arrow rows, numpy masks, computed once.

This is where the engine needs pyarrow and numpy (with ``checkpoint``, which reads the rows, and
``stats_columns``, which judges their statistics). ``file_state`` and ``snapshot`` import it only
when a snapshot really has checkpoint rows, so reading the log of a table without a checkpoint,
planning footprints and judging conflicts load neither library.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .actions import ADD, AddFile, FileKey, decode_action
from .errors import LogCorruptError
from .stats_columns import StatsColumns

#: Checkpoint rows grouped by partition: per row a group code, per group its raw partition values.
PartitionGroups = tuple[np.ndarray, list[tuple[str | None, ...]]]


@dataclass(frozen=True, eq=False)
class CheckpointFiles:
    """The add rows of one checkpoint, and what plans derive from them alone, computed once.

    A checkpoint never changes and ``FileState.apply`` (hence ``Snapshot.update()``) keeps it,
    changing only which rows are live and the adds after it. So what depends on the rows alone is
    cached here and shared by every snapshot built on the checkpoint: the paths, the rows grouped
    by partition values, and the statistics ``stats_columns`` parses lazily. Re-planning after an
    update then touches only what the update changed.
    """

    adds: pa.ChunkedArray
    #: The checkpoint file ``adds`` was read from, named by errors in its rows.
    source: str
    _groups: dict[tuple[str, ...], PartitionGroups] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __len__(self) -> int:
        return len(self.adds)

    @cached_property
    def paths(self) -> pa.ChunkedArray:
        return pc.struct_field(self.adds, "path")

    @cached_property
    def stats(self) -> StatsColumns:
        stats_json = pc.struct_field(self.adds, "stats") if self.adds.type.get_field_index("stats") >= 0 else None
        return StatsColumns(stats_json, len(self.adds))

    def partition_groups(self, physical_names: tuple[str, ...]) -> PartitionGroups:
        """All rows (dropped ones included) grouped by their raw values of these partition columns."""
        with self._lock:
            groups = self._groups.get(physical_names)
            if groups is None:
                values = pc.struct_field(self.adds, "partitionValues").combine_chunks()
                columns = [pc.map_lookup(values, name, "first") for name in physical_names]
                groups = self._groups[physical_names] = _distinct_rows(columns)
            return groups

    def decode(self, indices: np.ndarray) -> list[AddFile]:
        """The rows at ``indices`` as ``AddFile`` objects; a defect names the checkpoint file."""
        if len(indices) == 0:
            return []
        try:
            rows = self.adds.take(pa.array(indices, type=pa.int64())).to_pylist(maps_as_pydicts="strict")
        except (pa.ArrowException, KeyError, ValueError, OverflowError) as exc:  # KeyError: duplicate map key
            raise LogCorruptError(f"checkpoint add rows cannot be decoded: {exc}", path=self.source) from exc
        adds = [decode_action(ADD, row, self.source) for row in rows]
        return [add for add in adds if isinstance(add, AddFile)]

    # -- which rows are live ---------------------------------------------------------------------
    def live_mask(self, dropped: frozenset[int]) -> np.ndarray:
        """Per row, whether it is live once ``dropped`` are masked (read-only: shared by every caller)."""
        mask = np.ones(len(self), dtype=bool)
        if dropped:
            mask[np.fromiter(dropped, dtype=np.int64)] = False
        mask.flags.writeable = False
        return mask

    @staticmethod
    def live_rows(live: np.ndarray) -> np.ndarray:
        """The indices of the rows ``live`` keeps, ascending."""
        return np.flatnonzero(live)

    def live_paths(self, live: np.ndarray) -> list[str]:
        """Paths of the rows ``live`` keeps, in row order; no ``AddFile`` objects built."""
        paths: list[str] = self.paths.filter(pa.array(live)).to_pylist()
        return paths

    def rows_with_keys(self, keys: Iterable[FileKey], dropped: frozenset[int]) -> frozenset[int]:
        """The rows not in ``dropped`` whose logical file is one of ``keys``."""
        wanted: set[FileKey] = set(keys)
        paths = pa.array(sorted({k[0] for k in wanted}), type=pa.string())
        mask = pc.is_in(self.paths, value_set=paths)
        candidates = pc.indices_nonzero(mask).to_numpy()
        if not len(candidates):
            return frozenset()
        adds = self.decode(candidates)
        return frozenset(
            i for i, add in zip(candidates.tolist(), adds, strict=True) if i not in dropped and add.key in wanted
        )

    def live_rows_in_partitions(
        self, live: np.ndarray, physical: tuple[str, ...],
        judge_partition: Callable[[tuple[str | None, ...], str], bool],
    ) -> np.ndarray:
        """Rows (ascending) that ``live`` keeps and whose partition ``judge_partition`` accepts.

        Rows are judged per distinct partition (a few hundred at most in practice), not per row;
        the grouping is computed once per checkpoint. A partition value that is not valid for its
        type is an error only when a live row holds it, as when each live file is typed.
        """
        if not physical:
            return np.flatnonzero(live)
        codes, uniques = self.partition_groups(physical)
        verdicts = np.zeros(len(uniques), dtype=bool)
        for code, raw in enumerate(uniques):
            try:
                verdicts[code] = judge_partition(raw, self.source)
            except LogCorruptError:
                if live[codes == code].any():
                    raise
        return np.flatnonzero(live & verdicts[codes])


def _distinct_rows(columns: list[pa.Array]) -> PartitionGroups:
    """Group rows by the tuple of values in ``columns``: per row a group code, per group its values.

    Codes are renumbered densely after each column, so they stay below rows x distinct values and
    cannot overflow however many partition columns there are.
    """
    codes = np.zeros(len(columns[0]), dtype=np.int64)
    groups: list[tuple[str | None, ...]] = [()]
    for column in columns:
        encoded = column.dictionary_encode()
        # Nulls have no dictionary index: give them their own slot after the dictionary.
        dictionary = [*encoded.dictionary.to_pylist(), None]
        null_slot = len(dictionary) - 1
        indices = np.where(encoded.indices.is_null().to_numpy(zero_copy_only=False), null_slot,
                           encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)).astype(np.int64)
        width = len(dictionary)
        combined, codes = np.unique(codes * width + indices, return_inverse=True)
        groups = [(*groups[value // width], dictionary[value % width]) for value in combined.tolist()]
    return codes.reshape(-1), groups
