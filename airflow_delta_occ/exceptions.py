"""Errors of the provider's job layer (operators, JobSpec, runner).

Engine errors (``airflow_delta_occ.engine.errors``) keep their own classes; these add what a DAG
author can get wrong before Spark starts, and what the runner reports after it ran.
"""

from __future__ import annotations

from airflow_delta_occ.engine.errors import DeltaOccError


class DeltaJobError(DeltaOccError):
    """A Delta job cannot be built or did not complete."""


class ProviderConfigError(DeltaJobError):
    """An option of the ``[delta_occ]`` config section cannot be used."""


class JobSpecError(DeltaJobError):
    """The job description is incomplete or contradictory (raised before Spark starts)."""


class PartitionSpecError(JobSpecError):
    """``partitions=`` names a column that is not a partition column, or gives an unusable value."""


class MissingPartitionConstraintError(JobSpecError):
    """``strict_partitions=True`` and the job does not constrain the partitions it touches."""


class UnsafeExpressionError(JobSpecError):
    """A condition or expression from the DAG is not accepted as SQL (comments, ``;``, bad syntax)."""


class SourceNotFoundError(DeltaJobError):
    """The job's source table, path or query could not be read."""


class ConflictSkipped(DeltaJobError):
    """A conflict whose policy is ``skip``: the work is already done or no longer needed."""


class CommitNotConfirmedError(DeltaJobError):
    """Spark reported success but the Delta log shows no commit tagged with this run."""


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


def rejection_from_name(name: str, message: str) -> DeltaJobError:
    """Rebuild a refusal the runner reported by class name (spark-submit mode), as the same class.

    Only the job layer's input errors travel this way; their constructors take the message alone.
    Anything else becomes a ``JobSpecError`` that names the original class.
    """
    for cls in _REJECTIONS:
        if cls.__name__ == name:
            return cls(message)
    return JobSpecError(f"{name}: {message}")


_REJECTIONS: tuple[type[DeltaJobError], ...] = (
    JobSpecError, PartitionSpecError, MissingPartitionConstraintError, UnsafeExpressionError, SourceNotFoundError,
    SourceOutsidePartitionsError,
)
