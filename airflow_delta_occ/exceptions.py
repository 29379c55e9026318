"""Errors of the provider's job layer (operators, JobSpec, runner).

Engine errors (``airflow_delta_occ.engine.errors``) keep their own classes; these add what a DAG
author can get wrong before Spark starts, and what the runner reports after it ran.
"""

from __future__ import annotations

from typing import Any

from airflow_delta_occ.engine.errors import ConflictKind, DeltaOccError


class DeltaJobError(DeltaOccError):
    """A Delta job cannot be built or did not complete."""


class ProviderConfigError(DeltaJobError):
    """An option of the ``[delta_occ]`` config section cannot be used."""


class PoolConfigError(ProviderConfigError):
    """The conflict pool file (``[delta_occ] pool_file``) cannot be read or defines unusable pools.

    Raised when the file is loaded, naming the file and the entry, so a typo fails once instead of
    leaving a table outside its pool; and by ``PoolConfig.pool_for`` rather than choosing between
    two pools that match one table.
    """


class JobSpecError(DeltaJobError):
    """The job description is incomplete or contradictory (raised before Spark starts)."""


class PartitionSpecError(JobSpecError):
    """``partitions=`` names a column that is not a partition column, or gives an unusable value."""


class MissingPartitionConstraintError(JobSpecError):
    """``strict_partitions=True`` and the job does not constrain the partitions it touches."""


class UnsafeExpressionError(JobSpecError):
    """A condition or expression from the DAG is not accepted as SQL (comments, ``;``, bad syntax)."""


class StatementTextError(UnsafeExpressionError):
    """A value that becomes statement text holds ``${``, which Spark would rewrite before parsing.

    Spark's variable substitution (``spark.sql.variable.substitute``) replaces ``${conf}``,
    ``${env:NAME}`` and ``${system:NAME}`` anywhere in a statement, inside quoted literals and
    identifiers too. The runner turns it off for the provider's statements; refusing the marker as
    well keeps the text Spark parses the text the provider checked, whatever the session's settings.
    """


class SessionSettingError(JobSpecError):
    """The Spark session keeps a setting that changes what the provider's SQL text means, and the
    provider cannot set it for its statements (a Spark Connect server that fixes it, say).

    Raised before anything is written, naming the setting, the value the session keeps and the one
    the statements were rendered for.
    """


class StatementRefusedError(JobSpecError):
    """Spark refused the job's statement when it analysed it (an unknown column, a type mismatch).

    Raised by the runner, with the first line of Spark's message; retrying cannot fix it.
    """


class SourceNotFoundError(DeltaJobError):
    """The job's source table, path or query could not be read."""


class ConflictSkipped(DeltaJobError):
    """A conflict whose policy is ``skip``: the work is already done or no longer needed."""

    def __init__(self, message: str, *, kind: ConflictKind | None = None) -> None:
        super().__init__(message)
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"kind": self.kind}))


class ConflictFailure(DeltaJobError):
    """A Delta conflict whose policy says fail, or whose retries inside the job ran out.

    The message names the conflict, the attempts and the advice for the DAG author; ``kind`` is what
    the task-level retry policy decides on. Build it with ``retry.classify.conflict_failure``.
    """

    def __init__(self, message: str, *, kind: ConflictKind, attempts: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"kind": self.kind, "attempts": self.attempts}))


class JobStoppedEarly(DeltaJobError):
    """An attempt whose Spark work the runner cancelled because a commit that landed while it ran makes its own
    commit certain to fail (early abort): what Delta would have raised at the end, raised now.

    ``kind`` is that conflict, so the retry policies treat the attempt as the conflict itself; ``version`` and
    ``operation`` name the commit that doomed it; the message says "winning version N", as the engine's
    conflicts do.
    """

    def __init__(self, message: str, *, kind: ConflictKind, version: int, operation: str | None) -> None:
        super().__init__(message)
        self.kind = kind
        self.version = version
        self.operation = operation

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"kind": self.kind, "version": self.version,
                                                   "operation": self.operation}))


class StorageConnectionError(ProviderConfigError):
    """A storage connection (``storage_conn_id``) is missing, of a type the provider cannot use, or
    holds settings it cannot apply; raised before the table is read."""


class UnsafeLogStoreError(DeltaJobError):
    """Commits to the table could be lost: it is on S3 and each job starts its own Spark driver, but
    the LogStore keeps commits exclusive only inside one driver. Raised before anything is written."""


class CommitNotConfirmedError(DeltaJobError):
    """Spark reported success but the Delta log shows no commit tagged with this run."""


class CommitOutsidePartitionsError(DeltaJobError):
    """The job's commit removed or added files outside the partitions it was planned for.

    Found by reading the commit's own actions in the Delta log after Spark reported success, so an
    escape from any cause (a statement Spark rewrote, a bug, a changed table) fails the task loudly
    instead of being reported as confirmed. ``partitions`` are the partition values touched outside
    the plan, ``version`` the commit, ``restore`` the statement that undoes it. Never retried.
    """

    def __init__(self, message: str, *, version: int | None = None,
                 partitions: tuple[dict[str, str | None], ...] = (), restore: str | None = None) -> None:
        super().__init__(message)
        self.version = version
        self.partitions = partitions
        self.restore = restore

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"version": self.version, "partitions": self.partitions,
                                                    "restore": self.restore}))


class JobKilledError(DeltaJobError):
    """The task was killed before its job committed: while the Spark job ran (``on_kill`` stopped it), or
    while it waited in the worker for its conflict-pool lease (the request is cancelled).

    The table is at the version before the job (a commit is all or nothing); a retry runs it again. The
    operators read the Delta log before they say so: a kill that landed after the commit raises
    ``JobKilledAfterCommitError`` instead.
    """


class JobKilledAfterCommitError(DeltaJobError):
    """The task was killed after its job committed: the write is in the table (``version``), so the task
    fails though nothing is missing. Checked in the Delta log, not guessed: do not run the write again (a
    retry of the same task run finds the commit and writes nothing, see ``idempotent``)."""

    def __init__(self, message: str, *, version: int, idempotent: bool = True) -> None:
        super().__init__(message)
        self.version = version
        self.idempotent = idempotent   # False: a retry would write again (``DeltaConflictRetryPolicy`` fails it)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"version": self.version, "idempotent": self.idempotent}))


class SourceOutsidePartitionsError(JobSpecError):
    """Source rows would be written outside ``partitions=`` (raised before anything is written).

    ``count`` is the number of such rows and ``samples`` a few of their partition values. Pass
    ``source_outside_partitions="drop"`` to leave them out instead (the result counts them).
    """

    def __init__(self, message: str, *, count: int | None = None,
                 samples: tuple[dict[str, object], ...] = ()) -> None:
        super().__init__(message)
        self.count = count
        self.samples = samples

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"count": self.count, "samples": self.samples}))


def _rebuild(cls: type[DeltaJobError], message: str, fields: dict[str, Any]) -> DeltaJobError:
    """Unpickle an error whose constructor takes keyword fields (Airflow may pickle task errors)."""
    return cls(message, **fields)


class LeaseError(DeltaJobError):
    """A conflict pool's lease store refused an operation or could not be reached."""


class LeaseLostError(LeaseError):
    """The lease (or waiting request) is gone: released, or expired because heartbeats stopped.

    A writer that gets this while its job runs no longer holds the pool's protection.
    """


class LeaseOwnershipError(LeaseError):
    """A task try tried to renew or release a lease another task try owns (a stale or confused holder)."""


class LeaseStoreError(LeaseError):
    """The lease store's database failed or holds rows this provider cannot read."""
