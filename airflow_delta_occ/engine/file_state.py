"""The set of live files of a snapshot: checkpoint rows in Arrow plus later adds as Python objects.

Reconciliation follows the protocol: a logical file is ``(path, deletion vector id)``, the newest
action per key wins, and a remove deletes only its own key. Checkpoint rows that a later commit
replaced are masked by row index instead of copied, so bringing a 100,000-file snapshot forward by
one commit costs one vectorised ``is_in`` over the paths and no copy of the table.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .actions import ADD, AddFile, decode_action
from .errors import LogCorruptError
from .stats_columns import StatsByText, StatsColumns

FileKey = tuple[str, str]
#: Per logical file, the newest action of a run of commits: an add, or ``None`` for a remove.
PendingChanges = Mapping[FileKey, AddFile | None]
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


@dataclass(frozen=True)
class FileState:
    base: CheckpointFiles | None = None
    dropped: frozenset[int] = frozenset()
    extra: Mapping[FileKey, AddFile] = field(default_factory=dict)
    #: Parsed statistics of ``extra`` files; a pure memo, handed on to every state derived from this one.
    extra_stats: StatsByText = field(default_factory=StatsByText, compare=False, repr=False)

    @classmethod
    def from_checkpoint(cls, base: pa.ChunkedArray | None, inline_adds: list[AddFile], source: str) -> FileState:
        rows = CheckpointFiles(base, source) if base is not None else None
        return cls(rows, frozenset(), {add.key: add for add in inline_adds})

    @property
    def num_files(self) -> int:
        base_rows = len(self.base) if self.base is not None else 0
        return base_rows - len(self.dropped) + len(self.extra)

    def apply(self, changes: PendingChanges) -> FileState:
        """A new state with ``changes`` applied; ``self`` is left untouched (snapshots are immutable).

        The checkpoint rows (and so every cache on them) carry over unchanged.
        """
        if not changes:
            return self
        extra = dict(self.extra)
        for key, add in changes.items():
            extra.pop(key, None)
            if add is not None:
                extra[key] = add
        dropped = self.dropped
        if self.base is not None:
            hits = self._base_rows_with_keys(self.base, changes.keys())
            if hits:
                dropped = dropped | hits
        return FileState(self.base, dropped, extra, self.extra_stats)

    def _base_rows_with_keys(self, base: CheckpointFiles, keys: object) -> frozenset[int]:
        wanted: set[FileKey] = set(keys)  # type: ignore[call-overload]
        paths = pa.array(sorted({k[0] for k in wanted}), type=pa.string())
        mask = pc.is_in(base.paths, value_set=paths)
        candidates = pc.indices_nonzero(mask).to_numpy()
        if not len(candidates):
            return frozenset()
        adds = base.decode(candidates)
        return frozenset(
            i for i, add in zip(candidates.tolist(), adds, strict=True) if i not in self.dropped and add.key in wanted
        )

    @cached_property
    def live_mask(self) -> np.ndarray:
        """Per checkpoint row, whether it is still live (read-only: shared by every caller)."""
        assert self.base is not None
        mask = np.ones(len(self.base), dtype=bool)
        if self.dropped:
            mask[np.fromiter(self.dropped, dtype=np.int64)] = False
        mask.flags.writeable = False
        return mask

    def paths(self) -> list[str]:
        """Paths of all live files (checkpoint rows first); cheap, no AddFile objects built."""
        result: list[str] = []
        if self.base is not None:
            live = self.base.paths.filter(pa.array(self.live_mask))
            result.extend(live.to_pylist())
        result.extend(add.path for add in self.extra.values())
        return result

    def live_base_indices(self) -> np.ndarray:
        return np.flatnonzero(self.live_mask)

    def base_files(self, indices: np.ndarray) -> list[AddFile]:
        """Materialise the base rows at ``indices`` as ``AddFile`` objects."""
        assert self.base is not None
        return self.base.decode(indices)

    def files(self) -> Iterator[AddFile]:
        if self.base is not None:
            yield from self.base_files(self.live_base_indices())
        yield from self.extra.values()
