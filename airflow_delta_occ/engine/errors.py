"""Typed errors of the commit engine.

Every failure the engine can report has its own class so callers (operators, sensors, the conflict
pool) can react to the kind of problem without parsing messages, and every message names the file,
line, version or column involved so a person can act on it without a debugger.

    DeltaOccError
    ├── TableNotFoundError          no ``_delta_log`` (or no commit) at the path
    ├── LogError                    the log exists but cannot be read correctly
    │   ├── LogCorruptError         bad JSON line, missing checkpoint part, gap in versions, ...
    │   ├── VersionNotFoundError    requested version does not exist or was cleaned up
    │   └── UnsupportedProtocolError  a reader version or feature this engine cannot honour
    ├── InvalidVersionError         a version argument that is not an integer (``snapshot('1')``)
    ├── PredicateError              a filter the engine cannot accept
    │   ├── PredicateSyntaxError    the SQL text does not parse
    │   ├── UnknownColumnError      a column the table does not have
    │   ├── InvalidLiteralError     a literal that does not fit the column's type
    │   └── ExpressionDecodeError   JSON that does not describe an expression (``expr_from_json``)
    ├── FootprintDecodeError        JSON that does not describe a planned job (``Footprint.from_json``)
    ├── StorageError                the filesystem refused an operation
    │   └── FileAlreadyExistsError  put-if-absent lost the race for a version
    ├── CommitError                 a commit could not be made
    │   ├── InvalidCommitError      the staged actions break a protocol rule (nothing was written)
    │   └── CommitRetriesExceededError  the bounded rebase loop gave up
    └── DeltaConcurrentModificationException   a winning commit conflicts (names as in delta-spark)
        ├── ConcurrentAppendException
        ├── ConcurrentDeleteReadException
        ├── ConcurrentDeleteDeleteException
        ├── MetadataChangedException
        ├── ProtocolChangedException
        ├── ConcurrentTransactionException
        └── ConcurrentWriteException
"""

from __future__ import annotations

from enum import StrEnum


class DeltaOccError(Exception):
    """Base class of every error raised by ``airflow_delta_occ.engine``."""


class TableNotFoundError(DeltaOccError):
    """The path holds no Delta table: no ``_delta_log`` directory or no commit in it."""

    def __init__(self, table_uri: str, detail: str = "") -> None:
        self.table_uri = table_uri
        msg = f"no Delta table at {table_uri!r}"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class LogError(DeltaOccError):
    """The transaction log exists but cannot be reconstructed correctly."""


class LogCorruptError(LogError):
    """A log file is malformed or a file the log needs is missing.

    ``path`` names the offending file and ``line`` (1-based) the line of a JSON commit, when known.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f" [{path}" + (f", line {line}" if line is not None else "") + "]"
        super().__init__(message + where)


class VersionNotFoundError(LogError):
    """The requested version is newer than the table or older than the retained log."""

    def __init__(self, version: int, *, earliest: int | None, latest: int | None, reason: str) -> None:
        self.version = version
        self.earliest = earliest
        self.latest = latest
        super().__init__(
            f"version {version} cannot be read: {reason} "
            f"(reconstructable versions: {earliest}..{latest})"
        )


class UnsupportedProtocolError(LogError):
    """The table needs a reader version or reader feature the engine does not implement.

    The engine refuses instead of guessing: a wrong file set would make conflict decisions wrong.
    """

    def __init__(self, message: str, *, features: frozenset[str] = frozenset()) -> None:
        self.features = features
        super().__init__(message)


class InvalidVersionError(DeltaOccError):
    """A version (or version bound) handed to the engine is not an integer: text, a bool, a float.

    Not a ``VersionNotFoundError``: nothing is wrong with the table, the caller passed something that
    is not a version, typically a templated value that arrived as the text ``'1'``. Refused before
    the log is read, instead of a ``TypeError`` from a comparison or ``True`` read as version 1.
    """

    def __init__(self, value: object, what: str = "version") -> None:
        self.value = value
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        super().__init__(f"{what} must be an integer, got {type(value).__name__} {shown}")


class PredicateError(DeltaOccError):
    """A predicate cannot be parsed or does not fit the table."""


class PredicateSyntaxError(PredicateError):
    """The predicate text is not in the supported SQL subset."""

    def __init__(self, message: str, *, text: str, position: int) -> None:
        self.text = text
        self.position = position
        pointer = " " * position + "^"
        super().__init__(f"{message} at position {position}:\n  {text}\n  {pointer}")


class UnknownColumnError(PredicateError):
    """The predicate names a column the table's schema does not have."""

    def __init__(self, column: str, available: list[str]) -> None:
        self.column = column
        self.available = available
        super().__init__(f"unknown column {column!r}; the table has: {', '.join(available)}")


#: What a value of each type looks like as text, for a message that says what to write instead.
EXPECTED_FORMS = {
    "date": "a date as YYYY-MM-DD (for example 2024-01-31)",
    "timestamp": "a timestamp as YYYY-MM-DD[ HH:MM:SS[.ffffff]][+HH:MM] (UTC when no offset is given)",
    "timestamp_ntz": "a timestamp without a time zone as YYYY-MM-DD[ HH:MM:SS[.ffffff]]",
    "boolean": "true or false",
    "float": "a number (for example 1.5 or 2e-3)",
    "double": "a number (for example 1.5 or 2e-3)",
    "byte": "a whole number from -128 to 127",
    "short": "a whole number from -32768 to 32767",
    "integer": "a whole number from -2147483648 to 2147483647",
    "long": "a whole number from -9223372036854775808 to 9223372036854775807",
}


class InvalidLiteralError(PredicateError):
    """A literal cannot be converted to the type of the column it is compared with.

    The message says why when the conversion said so (``reason``) and what a value of the type looks
    like (``EXPECTED_FORMS``; a decimal's precision and scale are in its type name).
    """

    def __init__(self, value: object, type_name: str, column: str | None = None, reason: str | None = None) -> None:
        self.value = value
        self.type_name = type_name
        self.column = column
        self.reason = reason
        target = f"column {column!r} of type {type_name}" if column else f"type {type_name}"
        message = f"value {value!r} is not a valid literal for {target}"
        if reason:
            message += f": {reason}"
        expected = EXPECTED_FORMS.get(type_name)
        super().__init__(f"{message}; expected {expected}" if expected else message)


class ExpressionDecodeError(PredicateError):
    """JSON handed to ``expr_from_json`` does not describe an expression.

    It comes from outside the process (a job spec, a lease, a trigger's arguments), so every defect
    is reported with ``path``, the place in the document (``$.args[1].right``), not as a Python error.
    """

    def __init__(self, message: str, *, path: str = "$") -> None:
        self.path = path
        shown = path if len(path) <= 160 else f"{path[:60]}...{path[-90:]}"  # the tail of a deep path matters
        super().__init__(f"invalid expression JSON at {shown}: {message}")


class FootprintDecodeError(DeltaOccError):
    """JSON handed to ``Footprint.from_json`` does not describe a footprint; ``field`` names the culprit."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        where = f", field {field}" if field is not None else ""
        super().__init__(f"invalid footprint JSON{where}: {message}")


class StorageError(DeltaOccError):
    """The storage layer failed (permission, network, ...)."""


class UnsupportedStorageError(StorageError):
    """The table's URI names a store the engine cannot read, or is malformed for its store, or the
    credentials given are for another store."""


class FileAlreadyExistsError(StorageError):
    """A put-if-absent write found the file already present: another writer won that version."""

    def __init__(self, path: str) -> None:
        self.path = path
        super().__init__(f"file already exists: {path}")


class CommitError(DeltaOccError):
    """A commit could not be made; nothing was written to the log."""


class InvalidCommitError(CommitError):
    """The staged actions break a rule of the Delta protocol (checked before anything is written)."""


class CommitRetriesExceededError(CommitError):
    """Other writers kept winning: the rebase loop stopped after ``attempts`` tries."""

    def __init__(self, attempts: int, last_version: int) -> None:
        self.attempts = attempts
        self.last_version = last_version
        super().__init__(
            f"gave up after {attempts} commit attempts; the table moved on to version {last_version} each time"
        )


class DeltaConcurrentModificationException(DeltaOccError):
    """A concurrent commit that won conflicts with this transaction.

    The subclasses carry delta-spark's class names and error classes, so code that classifies a
    real Spark failure and code that classifies an engine decision use one vocabulary.

    Attributes:
        error_class: delta-spark's error class (``DELTA_CONCURRENT_APPEND`` ...), SQLSTATE 2D521.
        version: the winning version that conflicts.
        operation: the winning commit's ``commitInfo.operation`` (``None`` if it recorded none).
        partition: the partition involved, as ``{column: value}``, when the check knows it.
        path: the data file involved, when the check knows it.
    """

    error_class = "DELTA_CONCURRENT_MODIFICATION"
    sql_state = "2D521"

    @property
    def kind(self) -> ConflictKind:
        """The conflict this exception reports (its class name is the kind's value)."""
        return ConflictKind(type(self).__name__)
    _what = "a concurrent commit conflicts with this transaction"

    def __init__(self, *, version: int, operation: str | None, detail: str = "",
                 partition: dict[str, str | None] | None = None, path: str | None = None) -> None:
        self.version = version
        self.operation = operation
        self.partition = partition
        self.path = path
        where = ""
        if partition:
            where = " in partition [" + ", ".join(f"{k}={v}" for k, v in partition.items()) + "]"
        elif partition is not None:
            where = " at the root of the unpartitioned table"
        if path is not None:
            where += f" (file {path})"
        winner = f"winning version {version} ({operation or 'unknown operation'})"
        message = f"[{self.error_class}] {self._what}{where}: {winner}"
        super().__init__(message + (f". {detail}" if detail else ""))


class ConcurrentAppendException(DeltaConcurrentModificationException):
    """Files were added where this transaction read."""

    error_class = "DELTA_CONCURRENT_APPEND"
    _what = "a concurrent commit added files that this transaction should have read"


class ConcurrentDeleteReadException(DeltaConcurrentModificationException):
    """A file this transaction read was removed by the winner."""

    error_class = "DELTA_CONCURRENT_DELETE_READ"
    _what = "a concurrent commit removed a file this transaction read"


class ConcurrentDeleteDeleteException(DeltaConcurrentModificationException):
    """A file this transaction removes was already removed by the winner."""

    error_class = "DELTA_CONCURRENT_DELETE_DELETE"
    _what = "a concurrent commit removed a file this transaction also removes"


class MetadataChangedException(DeltaConcurrentModificationException):
    """The winner changed the table's metadata in a way this transaction cannot adopt."""

    error_class = "DELTA_METADATA_CHANGED"
    _what = "the table's metadata was changed by a concurrent commit"


class ProtocolChangedException(DeltaConcurrentModificationException):
    """The winner changed the protocol, or both created the table."""

    error_class = "DELTA_PROTOCOL_CHANGED"
    _what = "the table's protocol was changed by a concurrent commit"


class ConcurrentTransactionException(DeltaConcurrentModificationException):
    """The winner wrote an application transaction id (or metadata domain) this transaction depends on."""

    error_class = "DELTA_CONCURRENT_TRANSACTION"
    _what = "a concurrent commit used the same application transaction id or metadata domain"


class ConcurrentWriteException(DeltaConcurrentModificationException):
    """A concurrent commit landed and this kind of transaction does not resolve conflicts."""

    error_class = "DELTA_CONCURRENT_WRITE"
    _what = "a concurrent commit landed since this transaction read the table"


CONFLICT_EXCEPTIONS: tuple[type[DeltaConcurrentModificationException], ...] = (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    MetadataChangedException,
    ProtocolChangedException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
)


class ConflictKind(StrEnum):
    """The conflict vocabulary of the whole provider: one member per delta-spark exception, by its name.

    Every table that speaks of conflicts derives from this one: the exception classes above (their
    error classes), the retry layer's classification and advice, and the planner's verdicts.
    """

    APPEND = "ConcurrentAppendException"
    DELETE_READ = "ConcurrentDeleteReadException"
    DELETE_DELETE = "ConcurrentDeleteDeleteException"
    METADATA = "MetadataChangedException"
    PROTOCOL = "ProtocolChangedException"
    TRANSACTION = "ConcurrentTransactionException"
    WRITE = "ConcurrentWriteException"

    @property
    def exception_class(self) -> type[DeltaConcurrentModificationException]:
        """The engine's exception class of this kind."""
        return _CONFLICT_CLASS[self]

    @property
    def error_class(self) -> str:
        """delta-spark's error class (``DELTA_CONCURRENT_APPEND`` ...)."""
        return _CONFLICT_CLASS[self].error_class


_CONFLICT_CLASS: dict[ConflictKind, type[DeltaConcurrentModificationException]] = {
    ConflictKind(cls.__name__): cls for cls in CONFLICT_EXCEPTIONS
}
if set(_CONFLICT_CLASS) != set(ConflictKind):  # a kind without its class would misclassify silently
    raise ImportError(f"conflict kinds without an exception class: {set(ConflictKind) - set(_CONFLICT_CLASS)}")
