"""Snapshots of a Delta table and the log they come from.

``DeltaLog`` is the entry point: it knows where the table is and how to read its files.
``DeltaLog.snapshot(version)`` rebuilds the table at a version from the newest checkpoint plus the
JSON commits after it; ``Snapshot.update()`` moves a snapshot forward by reading only the new
commits; ``DeltaLog.commits_after(v)`` returns the actions that landed after ``v`` (what conflict
checks and sensors consume). Nothing here starts Spark, so the scheduler, triggerer and sensors can
all use it.

Nothing here needs pyarrow or numpy either: the columnar work (reading a checkpoint, its rows as a
file table, statistics as arrays) is in ``checkpoint``, ``file_table`` and ``stats_columns``,
imported when a snapshot has a checkpoint or a plan judges statistics. Reading the log of a table
without a checkpoint, and planning on partitions alone, load neither library.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .actions import Action as Action
from .actions import (
    AddCDCFile,
    AddFile,
    CommitInfo,
    DomainMetadata,
    FileKey,
    Metadata,
    Protocol,
    RemoveFile,
    SetTransaction,
    parse_json_actions,
)
from .errors import InvalidVersionError, LogCorruptError, UnsupportedProtocolError, VersionNotFoundError
from .expressions import and_, split_conjuncts
from .file_state import FileState
from .log_segment import LOG_DIR, LogListing, build_segment, commit_file_name, list_log
from .object_store import StorageCredentials
from .predicates import (
    Expr,
    bind,
    every_row_matches,
    file_may_match,
    has_unknown,
    parse_predicate,
    references,
)
from .schema import DataType, StructField, StructType
from .stats import StatsLeaf, parse_stats_of, stats_leaves
from .storage import FileMeta, Storage, resolve_table
from .values import parse_partition_value

#: Reader features whose data layout this engine understands well enough to list files correctly.
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
        "variantType",
        "variantType-preview",
        "variantShredding-preview",
    }
)
MAX_READER_VERSION = 3


@dataclass(frozen=True)
class Commit:
    """The actions of one JSON commit, in file order."""

    version: int
    actions: tuple[Action, ...]
    file_modification_time: int

    @property
    def commit_info(self) -> CommitInfo | None:
        return next((a for a in self.actions if isinstance(a, CommitInfo)), None)

    @property
    def timestamp(self) -> int:
        """In-commit timestamp when the writer recorded one, else the file's modification time."""
        info = self.commit_info
        ict = info.in_commit_timestamp if info is not None else None
        return ict if ict is not None else self.file_modification_time

    def actions_of(self, kind: type[Any]) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


class DeltaLog:
    """A table's transaction log, at a path or URI (``/data/t``, ``file:///data/t``, ``s3://b/t``)."""

    def __init__(self, table_uri: str, storage: Storage | None = None, *,
                 credentials: StorageCredentials | None = None) -> None:
        self.table_uri = table_uri
        if storage is None:
            self.storage, self.table_root = resolve_table(table_uri, credentials)
        else:
            self.storage, self.table_root = storage, table_uri.rstrip("/")

    @classmethod
    def for_table(cls, table_uri: str, storage: Storage | None = None, *,
                  credentials: StorageCredentials | None = None) -> DeltaLog:
        """The log of the table at ``table_uri``; ``credentials`` open an object store (``s3a://`` ...)."""
        return cls(table_uri, storage, credentials=credentials)

    @property
    def log_path(self) -> str:
        return self.storage.join(self.table_root, LOG_DIR)

    def listing(self) -> LogListing:
        return list_log(self.storage, self.table_root)

    def latest_version(self) -> int:
        latest = self.listing().latest_version
        assert latest is not None
        return latest

    def snapshot(self, version: int | None = None) -> Snapshot:
        """The table at ``version`` (time travel) or at the newest version.

        Raises:
            TableNotFoundError: no ``_delta_log`` or no commit at the path.
            VersionNotFoundError: the version does not exist or can no longer be rebuilt.
            LogCorruptError: a needed log file is malformed or missing.
            UnsupportedProtocolError: the table needs a reader feature this engine lacks.
            InvalidVersionError: ``version`` is not an integer (``'1'``, ``True``, ``1.0``).
        """
        return self._load(self.listing(), None if version is None else _version_arg(version, "version"))

    def _load(self, listing: LogListing, version: int | None) -> Snapshot:
        segment = build_segment(listing, version)
        state = _ReplayState()
        if segment.checkpoint is not None:
            from .checkpoint import read_checkpoint  # pyarrow: loaded once a table has a checkpoint

            content = read_checkpoint(self.storage, self.table_root, segment.checkpoint)
            state.apply_actions(content.actions)
            state.files = FileState.from_checkpoint(content.adds, content.inline_adds, content.source)
        last_commit: Commit | None = None
        for version_, meta in segment.commits:
            last_commit = self._read_commit(version_, meta)
            state.apply_commit(last_commit)
        return state.finish(self, segment.version, last_commit, listing)

    def _read_commit(self, version: int, meta: FileMeta) -> Commit:
        try:
            data = self.storage.read_bytes(meta.path)
        except FileNotFoundError as exc:
            raise LogCorruptError("commit file vanished while reading", path=meta.path) from exc
        return Commit(version, tuple(parse_json_actions(data, meta.path)), meta.modification_time)

    def commits_after(self, version: int, *, until: int | None = None) -> list[Commit]:
        """Every commit with a version greater than ``version`` (up to ``until``), oldest first.

        Raises:
            VersionNotFoundError: a commit in the range was removed by log cleanup.
            InvalidVersionError: ``version`` or ``until`` is not an integer.
        """
        version = _version_arg(version, "version")
        until = None if until is None else _version_arg(until, "until")
        listing = self.listing()
        latest = listing.latest_version
        assert latest is not None
        end = latest if until is None else min(until, latest)
        commits = []
        for v in range(version + 1, end + 1):
            meta = listing.commits.get(v)
            if meta is None:
                raise VersionNotFoundError(
                    v, earliest=min(listing.commits, default=None), latest=latest,
                    reason=f"commit file {commit_file_name(v)} is not in the log",
                )
            commits.append(self._read_commit(v, meta))
        return commits

    def commit_if_present(self, version: int) -> Commit | None:
        """Commit ``version`` read by its name, or ``None`` when it is not (yet) in the log.

        One read, no listing: how a job that watches its table while it runs asks for the next commit
        every second, cheaply on an object store whose log holds thousands of files. The commit's file
        modification time is not read (``file_modification_time`` is 0): what matters here are its actions.
        """
        version = _version_arg(version, "version")
        path = self.storage.join(self.log_path, commit_file_name(version))
        try:
            data = self.storage.read_bytes(path)
        except FileNotFoundError:
            return None
        return Commit(version, tuple(parse_json_actions(data, path)), 0)

    def history(self, limit: int | None = None) -> list[Commit]:
        """Commits still in the log, newest first (``commit_info`` has operation, readVersion, ...)."""
        listing = self.listing()
        versions = sorted(listing.commits, reverse=True)
        if limit is not None:
            versions = versions[:limit]
        return [self._read_commit(v, listing.commits[v]) for v in versions]


def _version_arg(value: object, what: str) -> int:
    """``value`` as a version number, or ``InvalidVersionError`` naming ``what``.

    Integers of any kind (numpy's too) are accepted; a bool is refused although Python counts it as
    an int, since ``True`` meaning version 1 is always a caller's mistake.
    """
    numpy = sys.modules.get("numpy")  # a numpy bool exists only once numpy is loaded: never load it here
    if isinstance(value, bool) or (numpy is not None and isinstance(value, numpy.bool_)):
        raise InvalidVersionError(value, what)
    try:
        return operator.index(value)  # type: ignore[arg-type]  # anything with __index__ is an integer
    except TypeError:
        raise InvalidVersionError(value, what) from None


class _ReplayState:
    """Accumulates actions in log order; the newest protocol, metadata, txn and domain win."""

    def __init__(self) -> None:
        self.protocol: Protocol | None = None
        self.metadata: Metadata | None = None
        self.app_transactions: dict[str, SetTransaction] = {}
        self.domains: dict[str, DomainMetadata] = {}
        self.files = FileState()
        self.pending: dict[FileKey, AddFile | None] = {}

    def apply_actions(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, AddFile | RemoveFile):
                # A later action for the same logical file replaces an earlier one.
                self.pending.pop(action.key, None)
                self.pending[action.key] = action if isinstance(action, AddFile) else None
            elif isinstance(action, Metadata):
                self.metadata = action
            elif isinstance(action, Protocol):
                self.protocol = action
            elif isinstance(action, SetTransaction):
                self.app_transactions[action.app_id] = action
            elif isinstance(action, DomainMetadata):
                if action.removed:
                    self.domains.pop(action.domain, None)
                else:
                    self.domains[action.domain] = action
            elif isinstance(action, AddCDCFile | CommitInfo):
                pass

    def apply_commit(self, commit: Commit) -> None:
        self.apply_actions(commit.actions)

    def finish(self, log: DeltaLog, version: int, last_commit: Commit | None, listing: LogListing) -> Snapshot:
        if self.protocol is None:
            raise LogCorruptError(f"no protocol action found up to version {version}", path=log.log_path)
        if self.metadata is None:
            raise LogCorruptError(f"no metaData action found up to version {version}", path=log.log_path)
        check_reader_support(self.protocol)
        files = self.files.apply(self.pending)
        commit_meta = listing.commits.get(version)
        return Snapshot(
            log=log,
            version=version,
            protocol=self.protocol,
            metadata=self.metadata,
            files=files,
            app_transactions=dict(self.app_transactions),
            domains=dict(self.domains),
            last_commit=last_commit if last_commit is not None and last_commit.version == version else None,
            commit_file=commit_meta,
        )


def check_reader_support(protocol: Protocol) -> None:
    """Refuse tables whose layout the engine could misread.

    Raises:
        UnsupportedProtocolError: reader version above 3, or an unknown reader feature.
    """
    if protocol.min_reader_version > MAX_READER_VERSION:
        raise UnsupportedProtocolError(
            f"table requires reader version {protocol.min_reader_version}; "
            f"this engine reads up to version {MAX_READER_VERSION}"
        )
    if protocol.min_reader_version == MAX_READER_VERSION:
        unknown = (protocol.reader_features or frozenset()) - SUPPORTED_READER_FEATURES
        if unknown:
            raise UnsupportedProtocolError(
                f"table requires reader feature(s) {sorted(unknown)} that this engine does not "
                f"support (supported: {sorted(SUPPORTED_READER_FEATURES)})",
                features=frozenset(unknown),
            )


class Snapshot:
    """An immutable view of the table at one version."""

    def __init__(
        self,
        *,
        log: DeltaLog,
        version: int,
        protocol: Protocol,
        metadata: Metadata,
        files: FileState,
        app_transactions: Mapping[str, SetTransaction],
        domains: Mapping[str, DomainMetadata],
        last_commit: Commit | None,
        commit_file: FileMeta | None,
    ) -> None:
        self.log = log
        self.version = version
        self.protocol = protocol
        self.metadata = metadata
        self._files = files
        self.app_transactions = app_transactions
        self.domain_metadata = domains
        self._last_commit = last_commit
        self._commit_file = commit_file

    def __repr__(self) -> str:
        return f"Snapshot(table={self.log.table_uri!r}, version={self.version}, files={self.num_files})"

    # -- table description ------------------------------------------------------------------
    @property
    def schema(self) -> StructType:
        return self.metadata.schema

    @property
    def partition_columns(self) -> tuple[str, ...]:
        return self.metadata.partition_columns

    @property
    def table_properties(self) -> Mapping[str, str]:
        return self.metadata.configuration

    @property
    def isolation_level(self) -> str:
        return self.metadata.isolation_level

    @property
    def deletion_vectors_enabled(self) -> bool:
        return self.metadata.deletion_vectors_enabled

    @property
    def row_tracking_enabled(self) -> bool:
        return self.metadata.row_tracking_enabled

    @property
    def reader_features(self) -> frozenset[str]:
        return self.protocol.reader_features or frozenset()

    @property
    def writer_features(self) -> frozenset[str]:
        return self.protocol.writer_features or frozenset()

    @cached_property
    def commit_info(self) -> CommitInfo | None:
        """The ``commitInfo`` of this version's own commit (``None`` if the commit was cleaned up)."""
        commit = self._own_commit
        return commit.commit_info if commit is not None else None

    @cached_property
    def timestamp(self) -> int:
        """Commit time in epoch ms: the in-commit timestamp when present, else the file time."""
        commit = self._own_commit
        if commit is not None:
            return commit.timestamp
        return self._commit_file.modification_time if self._commit_file is not None else 0

    @cached_property
    def _own_commit(self) -> Commit | None:
        if self._last_commit is not None:
            return self._last_commit
        if self._commit_file is None:
            return None
        return self.log._read_commit(self.version, self._commit_file)

    def app_transaction_version(self, app_id: str) -> int | None:
        txn = self.app_transactions.get(app_id)
        return txn.version if txn is not None else None

    # -- files --------------------------------------------------------------------------------
    @property
    def num_files(self) -> int:
        return self._files.num_files

    def file_paths(self) -> list[str]:
        """Paths (as written in the log, URL-encoded, relative to the table) of all live files."""
        return self._files.paths()

    def files(self) -> list[AddFile]:
        return list(self._files.files())

    @cached_property
    def _partition_fields(self) -> list[tuple[str, str, Any]]:
        """(logical name, physical name, type) of each partition column."""
        fields = []
        for name in self.partition_columns:
            f = self.schema.find(name)
            if f is None:
                raise LogCorruptError(f"partition column {name!r} is not in the table schema",
                                      path=self.metadata.source, line=self.metadata.source_line)
            fields.append((f.name, f.physical_name, f.type))
        return fields

    def partition_values(self, add: AddFile) -> dict[str, Any]:
        """Typed partition values of a file, by logical column name."""
        return self._typed_partition(tuple(add.partition_values.get(p) for _, p, _ in self._partition_fields),
                                     add.path)

    @cached_property
    def _partition_types(self) -> tuple[DataType, ...]:
        return tuple(data_type for _, _, data_type in self._partition_fields)

    @cached_property
    def _stats_leaves(self) -> dict[str, StatsLeaf]:
        return stats_leaves(self.schema)

    def _typed_partition(self, raw: Sequence[str | None], path: str) -> dict[str, Any]:
        try:
            values = _parse_partition_values(tuple(raw), self._partition_types)
            return {name: value for (name, _, _), value in zip(self._partition_fields, values, strict=True)}
        except (ValueError, ArithmeticError):
            pass  # judged again column by column below, to name the column in the error
        typed = {}
        for (name, _, data_type), value in zip(self._partition_fields, raw, strict=True):
            try:
                typed[name] = parse_partition_value(value, data_type)
            except (ValueError, ArithmeticError) as exc:
                raise LogCorruptError(
                    f"partition value {value!r} of column {name!r} is not a valid {data_type.simple_string()}",
                    path=path,
                ) from exc
        return typed

    def bind(self, predicate: str | Expr, *, target_alias: str | None = None) -> Expr:
        """Parse (if text) and resolve a predicate against this table's schema."""
        expr = parse_predicate(predicate) if isinstance(predicate, str) else predicate
        return bind(expr, self.schema, target_alias=target_alias)

    def files_matching(self, predicate: str | Expr, *, target_alias: str | None = None) -> list[AddFile]:
        """The files a job filtering on ``predicate`` reads: exact on partitions, safe on stats.

        A top-level conjunct holding an expression outside the supported subset (functions,
        arithmetic, non-deterministic calls, another relation's columns such as a MERGE's
        ``s.id``) is dropped: it may stop the other conjuncts from narrowing further, never widen
        them, since an AND can only select fewer rows than each of its parts. Such an expression
        inside an OR makes that whole conjunct unknown, so a predicate with nothing else selects
        the whole table. This is what Delta records for a MERGE (the target-only conjuncts of its
        condition) and what its scan prunes by for UPDATE and DELETE.

        The split mirrors Delta's scan planning, because the answer must cover what Spark really
        reads: top-level conjuncts over partition columns only prune partitions exactly, and the
        other conjuncts skip files on statistics alone. Partition columns have no statistics, so
        inside a mixed conjunct (``id = 3 OR country = 'FR'``) they count as unknown, as they do
        for Delta's data skipping; judging them by partition value would drop files Spark scans.
        """
        expr = self.bind(predicate, target_alias=target_alias)
        partition_names = {name for name, _, _ in self._partition_fields}
        partition_filters: list[Expr] = []
        data_filters: list[Expr] = []
        for conjunct in split_conjuncts(expr):
            if has_unknown(conjunct):
                continue  # judged as "may be true": it cannot widen what the other conjuncts select
            (partition_filters if references(conjunct) <= partition_names else data_filters).append(conjunct)
        partition_filter = and_(*partition_filters)
        verdicts: dict[tuple[str | None, ...], bool] = {}

        def judge_partition(raw: tuple[str | None, ...], path: str) -> bool:
            """``partition_filter`` on one partition, remembered: each is judged once per call."""
            verdict = verdicts[raw] = file_may_match(partition_filter, self._typed_partition(raw, path), None)
            return verdict

        selected: list[AddFile] = []
        physical = tuple(p for _, p, _ in self._partition_fields)
        state = self._files
        base = state.base
        if base is not None:  # the checkpoint's rows, judged as arrays (pyarrow and numpy are loaded)
            in_partitions = base.live_rows_in_partitions(state.live_mask, physical, judge_partition)
            rows = in_partitions
            if data_filters and len(in_partitions):
                from .stats_columns import may_match_conjuncts

                columns = base.stats.bounds(self._leaves_read_by(data_filters), in_partitions)
                rows = in_partitions[may_match_conjuncts(data_filters, columns, len(in_partitions),
                                                         lambda i: base.stats.json_at(in_partitions[i]),
                                                         self._stats_leaves.values())]
            selected.extend(state.base_files(rows))
        if state.extra:
            candidates: list[AddFile] = []
            for add in state.extra.values():  # the adds since the checkpoint: usually a few hundred
                raw = tuple(map(add.partition_values.get, physical))
                verdict = verdicts.get(raw)
                if verdict is None:
                    verdict = judge_partition(raw, add.path)
                if verdict:
                    candidates.append(add)
            if data_filters and candidates:
                from .stats_columns import may_match_conjuncts  # numpy: loaded once statistics are judged

                texts = [add.stats for add in candidates]
                columns = state.extra_stats.bounds(self._leaves_read_by(data_filters), texts)
                keep = may_match_conjuncts(data_filters, columns, len(candidates), lambda i: [texts[j] for j in i],
                                           self._stats_leaves.values())
                candidates = list(itertools.compress(candidates, keep))
            selected.extend(candidates)
        return selected

    def holds_a_row_matching(self, predicate: str | Expr) -> bool:
        """Whether a live row of this version surely meets ``predicate``, known from the log alone: a file whose
        partition values and statistics make the predicate true on every row it holds, and that holds a row not
        deleted by its deletion vector. ``False`` means "not known" (Spark must be asked), never "no row".

        Early abort asks this before it stops an UPDATE or a DELETE, which commits a file only when a row meets
        its condition: answered here, no Spark query is needed. Columns whose comparisons Spark makes otherwise
        than by value are never judged: CHAR (padded), collated strings, and floating point (NaN and signed
        zero are not in the statistics' order). At most ``ROW_PROOF_FILES`` files are looked at: a condition no
        file meets on every row would otherwise parse the statistics of every file it selects.
        """
        expr = self.bind(predicate)
        if has_unknown(expr):
            return False
        leaves = self._stats_leaves
        read = references(expr)
        if not read <= leaves.keys() or any(not _compares_by_value(leaves[name][2]) for name in read):
            return False
        used = self._leaves_read_by([expr])
        for add in itertools.islice(self.files_matching(expr), ROW_PROOF_FILES):
            stats = parse_stats_of(add.stats, used)
            if stats is None or stats.num_records is None:
                continue
            deleted = add.deletion_vector.cardinality if add.deletion_vector is not None else 0
            if stats.num_records - deleted > 0 and every_row_matches(expr, self.partition_values(add), stats):
                return True
        return False

    def _leaves_read_by(self, exprs: list[Expr]) -> list[StatsLeaf]:
        """The statistics columns ``exprs`` read (columns without statistics, such as structs, have none)."""
        leaves = self._stats_leaves
        return [leaves[name] for name in sorted(set().union(*(references(e) for e in exprs)) & leaves.keys())]

    # -- moving forward ------------------------------------------------------------------------
    def update(self) -> Snapshot:
        """This table at its newest version, reading only the commits after ``self.version``.

        Falls back to a full load when those commits are no longer all in the log.
        """
        listing = self.log.listing()
        latest = listing.latest_version
        if latest is None or latest < self.version:   # gone (the load says so) or made anew: load it whole
            return self.log._load(listing, None)
        if latest == self.version:
            return self
        new_versions = range(self.version + 1, latest + 1)
        if any(v not in listing.commits for v in new_versions):
            return self.log._load(listing, None)
        state = _ReplayState()
        state.protocol, state.metadata = self.protocol, self.metadata
        state.app_transactions = dict(self.app_transactions)
        state.domains = dict(self.domain_metadata)
        state.files = self._files
        last: Commit | None = None
        for v in new_versions:
            last = self.log._read_commit(v, listing.commits[v])
            state.apply_commit(last)
        return state.finish(self.log, latest, last, listing)


ROW_PROOF_FILES = 1000
"""How many files ``Snapshot.holds_a_row_matching`` looks at before it says "not known"."""
_FLOATING = frozenset({"float", "double"})
_VALUE_SEMANTICS_KEYS = ("__CHAR_VARCHAR_TYPE_STRING", "__COLLATIONS")


def _compares_by_value(f: StructField) -> bool:
    """Whether Spark compares this column's values as the statistics order them (see ``holds_a_row_matching``)."""
    if any(key in f.metadata for key in _VALUE_SEMANTICS_KEYS):
        return False
    name = f.type.simple_string()
    return name not in _FLOATING and "collate" not in name.lower()


@functools.lru_cache(maxsize=16384)
def _parse_partition_values(raw: tuple[str | None, ...], types: tuple[DataType, ...]) -> tuple[Any, ...]:
    """Typed values of one partition, memoised: every re-plan types the same partitions again.

    Pure (the result depends on the strings and types alone); errors are not cached, and callers
    retry column by column to name the culprit.
    """
    return tuple(parse_partition_value(value, data_type) for value, data_type in zip(raw, types, strict=True))
