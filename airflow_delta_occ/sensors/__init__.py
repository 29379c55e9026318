"""Sensors: ``DeltaConflictSensor`` (a conflict pool's lease for a writer the provider does not run)
and its release step ``DeltaLeaseReleaseOperator``."""

from airflow_delta_occ.sensors.conflict import DeltaConflictSensor, DeltaLeaseReleaseOperator

__all__ = ["DeltaConflictSensor", "DeltaLeaseReleaseOperator"]
