"""``JobResult``: what a Delta job did, as one typed value in every mode (the mirror of ``JobSpec``).

The runner returns a ``JobResult`` whether the job ran in the worker (embedded), in a ``spark-submit``
application (printed as one JSON line) or against a Spark Connect server, and it never raises for
the job's own outcome: a refusal, a conflict, a skip or an error is a status with its message.
``raise_for_status`` is the one place that turns a status back into the provider's exception, so
the same failure raises the same class with the same message, and gets the same Airflow outcome,
in every mode.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar

from airflow_delta_occ.engine.errors import ConflictKind, TableNotFoundError
from airflow_delta_occ.exceptions import (
    ConflictFailure,
    ConflictSkipped,
    DeltaJobError,
    JobSpecError,
    JobStoppedEarly,
    MissingPartitionConstraintError,
    PartitionSpecError,
    SessionSettingError,
    SourceNotFoundError,
    SourceOutsidePartitionsError,
    StatementRefusedError,
    StatementTextError,
    UnsafeExpressionError,
)
from airflow_delta_occ.retry.policy import ConflictRecord


class JobStatus(StrEnum):
    """How a job ended. Every status but ``success`` raises in ``raise_for_status``."""

    SUCCESS = "success"
    SKIPPED = "skipped"      # a conflict whose policy is skip
    CONFLICT = "conflict"    # a conflict whose policy fails, or whose attempts ran out
    REJECTED = "rejected"    # the job's input was refused (never retried)
    ERROR = "error"          # anything else (left to Airflow's retries)


@dataclass(frozen=True)
class OpenLineageParent:
    """The OpenLineage parent job a Spark job's session held (``spark.openlineage.parent*`` confs).

    Read in the job itself, from the session it ran in, so the result says what Spark actually
    received, not what the operator meant to hand over: an embedded session that reuses the
    process's Spark context, or a cluster that drops confs, would show here as a different parent.
    """

    job_namespace: str | None = None
    job_name: str | None = None
    run_id: str | None = None
    root_job_namespace: str | None = None
    root_job_name: str | None = None
    root_run_id: str | None = None

    #: Field -> the Spark conf the OpenLineage provider's helper sets (and the Spark listener reads).
    SPARK_CONF: ClassVar[Mapping[str, str]] = {
        "job_namespace": "spark.openlineage.parentJobNamespace",
        "job_name": "spark.openlineage.parentJobName",
        "run_id": "spark.openlineage.parentRunId",
        "root_job_namespace": "spark.openlineage.rootParentJobNamespace",
        "root_job_name": "spark.openlineage.rootParentJobName",
        "root_run_id": "spark.openlineage.rootParentRunId",
    }

    def __post_init__(self) -> None:
        for name in self.SPARK_CONF:  # crosses a process boundary (spark-submit) as JSON
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"OpenLineageParent.{name} must be a string, got {value!r}")

    @classmethod
    def from_conf(cls, conf: Mapping[str, str]) -> OpenLineageParent | None:
        """The parent named by a session's confs; ``None`` when it holds none of the keys."""
        values = {name: conf[key] for name, key in cls.SPARK_CONF.items() if conf.get(key) is not None}
        return cls(**values) if values else None


@dataclass(frozen=True)
class JobLease:
    """The conflict-pool lease a job ran under: who granted it, how long the job waited for it and for
    whom, and whether the lease was lost while the job ran (Delta's own check still guarded it)."""

    pool: str
    request_id: str
    waited: float = 0.0
    waited_for: tuple[str, ...] = ()
    lost: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "waited", round(float(self.waited), 3))
        object.__setattr__(self, "waited_for", tuple(str(w) for w in self.waited_for))


@dataclass(frozen=True)
class JobResult:
    """What one Delta job did.

    ``version`` is the table version this task run committed (``None``: nothing committed, e.g. a
    DELETE that matched no row); ``already_committed`` says the commit was made by an earlier try of
    the same run, so this try wrote nothing. ``confirmed``, ``task_seconds`` and ``run_started_at``
    (epoch seconds: when the job went to Spark, what a lease's hand-over is measured to) are added by the
    operator after it checked the Delta log, and ``lease`` when the job ran under a conflict pool's
    lease. ``to_dict`` is the task's XCom value; ``from_json`` reads it back, lease included.
    """

    status: JobStatus
    table: str
    operation: str
    condition: str | None = None
    partition_filter: str | None = None
    version: int | None = None
    already_committed: bool = False
    metrics: Mapping[str, str] = field(default_factory=dict)
    attempts: int = 0
    conflicts: tuple[ConflictRecord, ...] = ()
    dropped_source_rows: int = 0
    run_seconds: float = 0.0
    wait_seconds: float = 0.0
    # the runner's steps, seconds: target_check, source_read, source_check, write (with in-job retries),
    # find_commit; the provider's own work in the driver is every step but the write
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    error_type: str | None = None
    conflict: ConflictKind | None = None
    refused: Mapping[str, Any] = field(default_factory=dict)   # fields of a refusal (rows outside...)
    confirmed: bool = False
    task_seconds: float | None = None
    run_started_at: float | None = None   # epoch seconds when the job went to Spark (added by the operator)
    spark_app_id: str | None = None   # the Spark application the job ran in (for the Spark UI link)
    spark_ui_url: str | None = None   # its driver's live UI, as the driver reports it (classic sessions)
    openlineage_parent: OpenLineageParent | None = None  # the parent job the job's Spark session held
    lease: JobLease | None = None   # the conflict-pool lease the job ran under (added by the operator)

    def __post_init__(self) -> None:
        # A JobResult crosses a process boundary in spark-submit mode: a value of the wrong type is a
        # typed error here, not a surprise in the operator.
        object.__setattr__(self, "status", JobStatus(self.status))
        if self.conflict is not None:
            object.__setattr__(self, "conflict", ConflictKind(self.conflict))
        if self.status is JobStatus.CONFLICT and self.conflict is None:
            raise JobSpecError("a conflict result needs the conflict kind")

    # -- JSON (spark-submit prints it; XCom stores it) ---------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the task's XCom value)."""
        return json.loads(self.to_json())  # type: ignore[no-any-return]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> JobResult:
        """Decode a result written by ``to_json``.

        Raises:
            DeltaJobError: not a JobResult.
        """
        try:
            data = json.loads(text) if isinstance(text, str) else dict(text)
            if not isinstance(data, dict):
                raise TypeError("a JobResult is a JSON object")
            conflicts = tuple(ConflictRecord(**c) for c in data.pop("conflicts", None) or ())
            seen = tuple(replace(c, kind=ConflictKind(c.kind)) for c in conflicts)
            parent = data.pop("openlineage_parent", None)
            lease = data.pop("lease", None)
            return cls(**data, conflicts=seen,
                       openlineage_parent=OpenLineageParent(**parent) if parent is not None else None,
                       lease=JobLease(**lease) if lease is not None else None)
        except (TypeError, ValueError, RecursionError) as exc:
            raise DeltaJobError(f"not a valid job result: {exc}") from exc

    # -- the one decoding of a status into the provider's exception --------------------------------
    def _last_stopped_early(self) -> JobStoppedEarly | None:
        """The early stop of the attempt that ended the job, rebuilt as the runner raised it (a skipped or failed
        conflict is raised from it, so whoever reports the failure can name the commit that stopped it)."""
        return _stopped_early_of(self.conflicts[-1]) if self.conflicts else None

    def raise_for_status(self) -> JobResult:
        """Return the result when the job succeeded; raise its typed exception otherwise.

        Raises:
            ConflictSkipped, ConflictFailure: a conflict the policy skips or fails on.
            JobSpecError (and subclasses), SourceNotFoundError, TableNotFoundError: refused input.
            DeltaJobError: any other failure of the job.
        """
        message = self.error or ""
        if self.status is JobStatus.SUCCESS:
            return self
        if self.status is JobStatus.SKIPPED:
            raise ConflictSkipped(message, kind=self.conflict) from self._last_stopped_early()
        if self.status is JobStatus.CONFLICT:
            assert self.conflict is not None  # __post_init__
            raise ConflictFailure(message, kind=self.conflict, attempts=self.attempts) from self._last_stopped_early()
        if self.status is JobStatus.REJECTED:
            build = REFUSALS.get(self.error_type or "")
            raise build(message, self) if build else JobSpecError(f"{self.error_type}: {message}")
        raise DeltaJobError(f"the Spark job failed: {message}")


def _stopped_early_of(record: ConflictRecord) -> JobStoppedEarly | None:
    if not record.early or record.winning_version is None:
        return None
    return JobStoppedEarly(record.message, kind=record.kind, version=record.winning_version,
                           operation=record.winning_operation)


def _by_message(cls: type[Exception]) -> Callable[[str, JobResult], Exception]:
    return lambda message, _result: cls(message)


def _table_not_found(message: str, result: JobResult) -> Exception:
    # The engine's constructor composes its message from the table and a detail; rebuild that text.
    prefix = f"no Delta table at {result.table!r}: "
    return TableNotFoundError(result.table, message.removeprefix(prefix) if message.startswith(prefix) else message)


def _source_outside(message: str, result: JobResult) -> Exception:
    count = result.refused.get("count")
    samples = tuple(dict(s) for s in result.refused.get("samples") or ())
    return SourceOutsidePartitionsError(message, count=count if isinstance(count, int) else None, samples=samples)


# The refusals a runner may report, by class name: each is rebuilt as the same class and message.
REFUSALS: Mapping[str, Callable[[str, JobResult], Exception]] = {
    **{cls.__name__: _by_message(cls) for cls in (
        JobSpecError, PartitionSpecError, MissingPartitionConstraintError, UnsafeExpressionError,
        SourceNotFoundError, StatementRefusedError, StatementTextError, SessionSettingError)},
    SourceOutsidePartitionsError.__name__: _source_outside,
    TableNotFoundError.__name__: _table_not_found,
}
REFUSED_TYPES: tuple[type[BaseException], ...] = (JobSpecError, SourceNotFoundError, TableNotFoundError)
"""What the runner reports as ``rejected`` (never retried); their class names are keys of ``REFUSALS``."""
