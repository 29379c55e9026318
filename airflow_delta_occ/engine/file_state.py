"""The set of live files of a snapshot: checkpoint rows in Arrow plus later adds as Python objects.

Reconciliation follows the protocol: a logical file is ``(path, deletion vector id)``, the newest
action per key wins, and a remove deletes only its own key. Checkpoint rows that a later commit
replaced are masked by row index instead of copied, so bringing a 100,000-file snapshot forward by
one commit costs one vectorised ``is_in`` over the paths and no copy of the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .actions import ADD, AddFile, decode_action
from .errors import LogCorruptError

FileKey = tuple[str, str]
#: Per logical file, the newest action of a run of commits: an add, or ``None`` for a remove.
PendingChanges = Mapping[FileKey, AddFile | None]


@dataclass(frozen=True)
class FileState:
    base: pa.ChunkedArray | None = None
    base_paths: pa.ChunkedArray | None = None
    dropped: frozenset[int] = frozenset()
    extra: Mapping[FileKey, AddFile] = field(default_factory=dict)
    #: The checkpoint file ``base`` was read from, named by errors in its rows.
    source: str | None = None

    @classmethod
    def from_checkpoint(cls, base: pa.ChunkedArray | None, inline_adds: list[AddFile], source: str) -> FileState:
        paths = pc.struct_field(base, "path") if base is not None else None
        return cls(base, paths, frozenset(), {add.key: add for add in inline_adds}, source)

    @property
    def num_files(self) -> int:
        base_rows = len(self.base) if self.base is not None else 0
        return base_rows - len(self.dropped) + len(self.extra)

    def apply(self, changes: PendingChanges) -> FileState:
        """A new state with ``changes`` applied; ``self`` is left untouched (snapshots are immutable)."""
        if not changes:
            return self
        extra = dict(self.extra)
        for key, add in changes.items():
            extra.pop(key, None)
            if add is not None:
                extra[key] = add
        dropped = self.dropped
        if self.base is not None:
            hits = self._base_rows_with_keys(changes.keys())
            if hits:
                dropped = dropped | hits
        return FileState(self.base, self.base_paths, dropped, extra, self.source)

    def _base_rows_with_keys(self, keys: object) -> frozenset[int]:
        assert self.base is not None
        wanted: set[FileKey] = set(keys)  # type: ignore[call-overload]
        paths = pa.array(sorted({k[0] for k in wanted}), type=pa.string())
        mask = pc.is_in(self._base_paths, value_set=paths)
        candidates = pc.indices_nonzero(mask).to_pylist()
        if not candidates:
            return frozenset()
        adds = self._decode(pa.array(candidates, type=pa.int64()))
        return frozenset(
            i for i, add in zip(candidates, adds, strict=True) if i not in self.dropped and add.key in wanted
        )

    def _decode(self, indices: Any) -> list[AddFile]:
        """The base rows at ``indices`` as ``AddFile`` objects; a defect names the checkpoint file."""
        assert self.base is not None
        source = self.source or "checkpoint"
        try:
            rows = self.base.take(indices).to_pylist(maps_as_pydicts="strict")
        except (pa.ArrowException, KeyError, ValueError, OverflowError) as exc:  # KeyError: duplicate map key
            raise LogCorruptError(f"checkpoint add rows cannot be decoded: {exc}", path=source) from exc
        adds = [decode_action(ADD, row, source) for row in rows]
        return [add for add in adds if isinstance(add, AddFile)]

    @property
    def _base_paths(self) -> pa.ChunkedArray:
        assert self.base_paths is not None
        return self.base_paths

    def _live_base_mask(self) -> np.ndarray:
        assert self.base is not None
        mask = np.ones(len(self.base), dtype=bool)
        if self.dropped:
            mask[np.fromiter(self.dropped, dtype=np.int64)] = False
        return mask

    def paths(self) -> list[str]:
        """Paths of all live files (checkpoint rows first); cheap, no AddFile objects built."""
        result: list[str] = []
        if self.base is not None:
            live = self._base_paths.filter(pa.array(self._live_base_mask()))
            result.extend(live.to_pylist())
        result.extend(add.path for add in self.extra.values())
        return result

    def base_partition_columns(self, physical_names: list[str]) -> list[pa.Array]:
        """One string column per partition column over all base rows (dropped rows included)."""
        assert self.base is not None
        values = pc.struct_field(self.base, "partitionValues").combine_chunks()
        return [pc.map_lookup(values, name, "first") for name in physical_names]

    def live_base_indices(self) -> np.ndarray:
        assert self.base is not None
        return np.nonzero(self._live_base_mask())[0]

    def base_files(self, indices: np.ndarray) -> list[AddFile]:
        """Materialise the base rows at ``indices`` as ``AddFile`` objects."""
        assert self.base is not None
        if len(indices) == 0:
            return []
        return self._decode(pa.array(indices, type=pa.int64()))

    def files(self) -> Iterator[AddFile]:
        if self.base is not None:
            yield from self.base_files(self.live_base_indices())
        yield from self.extra.values()

