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
