"""Which log files make up a version: the newest usable checkpoint plus the JSON commits after it.

The choice is made from one listing of ``_delta_log``, never from ``_last_checkpoint`` alone: that
file is a hint other readers use to shorten their listing, and it can be missing, stale (a newer
checkpoint exists) or wrong (its checkpoint is gone or incomplete). The listing is authoritative.
Incomplete multi-part checkpoints are skipped as the protocol requires, and an older checkpoint or
the JSON commits are used instead; if nothing older can rebuild the version, the error names the
incomplete checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .errors import LogCorruptError, TableNotFoundError, VersionNotFoundError
from .storage import FileMeta, Storage

LOG_DIR = "_delta_log"
SIDECARS_DIR = "_sidecars"

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2 = re.compile(r"^(\d{20})\.checkpoint\.([0-9a-fA-F-]{36})\.(json|parquet)$")

#: At most this many missing parts of an incomplete checkpoint are named in its error message.
_MISSING_PARTS_NAMED = 10

CheckpointKind = Literal["classic", "multipart", "v2"]


def commit_file_name(version: int) -> str:
    return f"{version:020d}.json"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its version, kind and files (parts in order)."""

    version: int
    kind: CheckpointKind
    files: tuple[FileMeta, ...]


@dataclass(frozen=True)
class LogListing:
    """Commits and checkpoints found in one listing of ``_delta_log``."""

    commits: dict[int, FileMeta]
    checkpoints: dict[int, list[Checkpoint]]
    incomplete: dict[int, str] = field(default_factory=dict)

    @property
    def latest_version(self) -> int | None:
        candidates = list(self.commits) + list(self.checkpoints)
        return max(candidates) if candidates else None

    @property
    def earliest_reconstructable(self) -> int | None:
        """The oldest version with a checkpoint or a full chain of commits from version 0."""
        starts = list(self.checkpoints)
        if 0 in self.commits:
            starts.append(0)
        return min(starts) if starts else None


def list_log(storage: Storage, table_root: str) -> LogListing:
    """List and classify ``_delta_log``; a table without it (or without any commit) is not a table."""
    log_dir = storage.join(table_root, LOG_DIR)
    try:
        entries = storage.list_dir(log_dir)
    except FileNotFoundError as exc:
        raise TableNotFoundError(table_root, f"{log_dir} does not exist") from exc
    except NotADirectoryError as exc:
        raise TableNotFoundError(table_root, f"{log_dir} is not a directory") from exc
    commits: dict[int, FileMeta] = {}
    classic: dict[int, FileMeta] = {}
    multipart: dict[tuple[int, int], dict[int, FileMeta]] = {}
    v2: dict[int, list[FileMeta]] = {}
    for meta in entries:
        name = meta.name
        if m := _COMMIT.match(name):
            commits[int(m.group(1))] = meta
        elif m := _CLASSIC.match(name):
            classic[int(m.group(1))] = meta
        elif m := _MULTIPART.match(name):
            version, part, parts = int(m.group(1)), int(m.group(2)), int(m.group(3))
            if 1 <= part <= parts:  # part 0, or a part beyond the count, belongs to no checkpoint
                multipart.setdefault((version, parts), {})[part] = meta
        elif m := _V2.match(name):
            v2.setdefault(int(m.group(1)), []).append(meta)
    checkpoints: dict[int, list[Checkpoint]] = {}
    incomplete: dict[int, str] = {}
    for version, meta in classic.items():
        checkpoints.setdefault(version, []).append(Checkpoint(version, "classic", (meta,)))
    for (version, parts), found in multipart.items():
        if len(found) < parts:
            incomplete[version] = _incomplete_reason(version, parts, found)
            continue
        ordered = tuple(found[p] for p in sorted(found))
        checkpoints.setdefault(version, []).append(Checkpoint(version, "multipart", ordered))
    for version, metas in v2.items():
        for meta in metas:
            checkpoints.setdefault(version, []).append(Checkpoint(version, "v2", (meta,)))
    if not commits and not checkpoints:
        raise TableNotFoundError(table_root, f"{log_dir} holds no commit or checkpoint")
    for version in checkpoints:
        checkpoints[version].sort(key=_checkpoint_preference)
    return LogListing(commits, checkpoints, incomplete)


def _incomplete_reason(version: int, parts: int, found: dict[int, FileMeta]) -> str:
    """Why a multi-part checkpoint is unusable, at a cost bounded by the files found.

    The part count comes from a file name, so it can claim billions of parts: the missing parts are
    named only when there are few of them, otherwise counted.
    """
    if parts - len(found) <= _MISSING_PARTS_NAMED:
        missing = [p for p in range(1, parts + 1) if p not in found]
        return f"multi-part checkpoint {version} is incomplete: part(s) {missing} of {parts} missing"
    return f"multi-part checkpoint {version} is incomplete: only {len(found)} of its {parts} parts are present"


def _checkpoint_preference(cp: Checkpoint) -> int:
    # V2 checkpoints carry everything a classic one does plus sidecars; prefer them when both exist.
    return {"v2": 0, "classic": 1, "multipart": 2}[cp.kind]


@dataclass(frozen=True)
class LogSegment:
    """The files that rebuild ``version``: an optional checkpoint and the commits after it, in order."""

    version: int
    checkpoint: Checkpoint | None
    commits: tuple[tuple[int, FileMeta], ...]


def build_segment(listing: LogListing, version: int | None = None) -> LogSegment:
    """Choose the checkpoint and commits for ``version`` (latest when ``None``).

    Raises:
        VersionNotFoundError: the version is newer than the table or older than what is retained.
        LogCorruptError: a commit file inside the needed range is missing.
    """
    latest = listing.latest_version
    assert latest is not None  # list_log guarantees a non-empty log
    target = latest if version is None else version
    earliest = listing.earliest_reconstructable
    if target < 0 or target > latest:
        raise VersionNotFoundError(target, earliest=earliest, latest=latest, reason="no such version")
    usable = sorted((v for v in listing.checkpoints if v <= target), reverse=True)
    checkpoint = listing.checkpoints[usable[0]][0] if usable else None
    start = checkpoint.version + 1 if checkpoint is not None else 0
    # The first gap only: a stray file named with an absurd version must not make this loop for ever.
    first = next((v for v in range(start, target + 1) if v not in listing.commits), None)
    if first is not None:
        if checkpoint is None and first == 0 and (earliest is None or target < earliest):
            reasons = [listing.incomplete[v] for v in sorted(listing.incomplete) if v <= target]
            reason = reasons[-1] if reasons else "its commits were removed by log cleanup"
            raise VersionNotFoundError(target, earliest=earliest, latest=latest, reason=reason)
        detail = f"commit file {commit_file_name(first)} is missing"
        broken = [listing.incomplete[v] for v in sorted(listing.incomplete) if start <= v <= target]
        if broken:
            detail += f" and {broken[-1]}"
        raise LogCorruptError(f"cannot rebuild version {target}: {detail}", path=LOG_DIR)
    commits = tuple((v, listing.commits[v]) for v in range(start, target + 1))
    return LogSegment(target, checkpoint, commits)
