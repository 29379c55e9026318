"""The set of live files of a snapshot: checkpoint rows in Arrow plus later adds as Python objects.

Reconciliation follows the protocol: a logical file is ``(path, deletion vector id)``, the newest
action per key wins, and a remove deletes only its own key. Checkpoint rows that a later commit
replaced are masked by row index instead of copied, so bringing a 100,000-file snapshot forward by
one commit costs one vectorised ``is_in`` over the paths and no copy of the table.

The rows themselves live in ``file_table.CheckpointFiles`` (pyarrow and numpy); this module
imports it only when there is a checkpoint, so a state of JSON commits alone needs neither library.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from .actions import AddFile, FileKey

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from .file_table import CheckpointFiles
    from .stats_columns import StatsByText

#: Per logical file, the newest action of a run of commits: an add, or ``None`` for a remove.
PendingChanges = Mapping[FileKey, AddFile | None]


class _StatsMemo:
    """Holds the ``StatsByText`` of the files after the checkpoint, made on first use (it needs numpy).

    One holder is handed from state to state, so every state derived from one shares its memo.
    """

    def __init__(self) -> None:
        self._memo: StatsByText | None = None
        self._lock = threading.Lock()

    def get(self) -> StatsByText:
        with self._lock:
            if self._memo is None:
                from .stats_columns import StatsByText

                self._memo = StatsByText()
            return self._memo


@dataclass(frozen=True)
class FileState:
    base: CheckpointFiles | None = None
    dropped: frozenset[int] = frozenset()
    extra: Mapping[FileKey, AddFile] = field(default_factory=dict)
    #: Holds the parsed statistics of ``extra`` files; a pure memo, handed on to every state derived
    #: from this one.
    _extra_stats: _StatsMemo = field(default_factory=_StatsMemo, compare=False, repr=False)

    @classmethod
    def from_checkpoint(cls, base: pa.ChunkedArray | None, inline_adds: list[AddFile], source: str) -> FileState:
        rows = None
        if base is not None:
            from .file_table import CheckpointFiles

            rows = CheckpointFiles(base, source)
        return cls(rows, frozenset(), {add.key: add for add in inline_adds})

    @property
    def extra_stats(self) -> StatsByText:
        """Parsed statistics of ``extra`` files, memoised by stats text."""
        return self._extra_stats.get()

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
            hits = self.base.rows_with_keys(changes.keys(), self.dropped)
            if hits:
                dropped = dropped | hits
        return FileState(self.base, dropped, extra, self._extra_stats)

    @cached_property
    def live_mask(self) -> np.ndarray:
        """Per checkpoint row, whether it is still live (read-only: shared by every caller)."""
        assert self.base is not None
        return self.base.live_mask(self.dropped)

    def paths(self) -> list[str]:
        """Paths of all live files (checkpoint rows first); cheap, no AddFile objects built."""
        result: list[str] = []
        if self.base is not None:
            result.extend(self.base.live_paths(self.live_mask))
        result.extend(add.path for add in self.extra.values())
        return result

    def live_base_indices(self) -> np.ndarray:
        assert self.base is not None
        return self.base.live_rows(self.live_mask)

    def base_files(self, indices: np.ndarray) -> list[AddFile]:
        """Materialise the base rows at ``indices`` as ``AddFile`` objects."""
        assert self.base is not None
        return self.base.decode(indices)

    def files(self) -> Iterator[AddFile]:
        if self.base is not None:
            yield from self.base_files(self.live_base_indices())
        yield from self.extra.values()
