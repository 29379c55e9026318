"""A conflict pool's lease for writers this provider does not run: wait for it, hand it over, release it.

A plain ``SparkSubmitOperator``, a Databricks job or a script that writes to a pooled table cannot
ask for a lease itself. ``DeltaConflictSensor`` asks for it from the arguments that describe that
writer (table, operation, partitions, an extra condition), waits deferred in the triggerer while a
conflicting job holds one, and succeeds holding the lease. Nobody renews it after that: it lives for
``lease_ttl`` seconds, which must cover the downstream writer, unless ``DeltaLeaseReleaseOperator``
(``trigger_rule="all_done"``: after the writer, whatever its outcome) releases it first. The TTL
starts again at the hand-over (a lease that expired between the grant in the triggerer and the
sensor's resumption is asked for again), and a sensor that stops waiting (its ``timeout``, or a
trigger error) cancels its request so that it does not keep its place in line.

The footprint is planned from the arguments, not from the writer's real statement, so it must not
be narrower than what the writer does: the predicate is the typed partition filter ANDed with
``condition``; an append or MERGE is taken to add files only to the partitions ``partitions=``
pins (every partition column), else anywhere. Describing the writer widely only serializes more;
describing it too narrowly lets a conflicting job run beside it, and then Delta's own commit check
still refuses one of the two.

The DAG processor imports this module: the engine and the request types load inside the methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperator, BaseSensorOperator
from airflow.sdk.bases.operator import TRIGGER_FAIL_REPR
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_delta_occ.exceptions import DeltaJobError, JobSpecError, LeaseLostError, LeaseStoreError
from airflow_delta_occ.hooks.leases import (
    DeltaLeaseStoreHook,
    check_pooled_literal,
    lease_owner,
    pooled_table,
    required_pool,
    route_to_airflow_pool,
)
from airflow_delta_occ.jobs.checks import templated
from airflow_delta_occ.jobs.operations import JobOperation
from airflow_delta_occ.jobs.partitions import (
    build_partition_filter,
    conjoin_exprs,
    parse_expression,
    partitions_mapping,
)
from airflow_delta_occ.pools import holding

if TYPE_CHECKING:
    from airflow_delta_occ.engine.planner import Footprint
    from airflow_delta_occ.engine.snapshot import Snapshot
    from airflow_delta_occ.pools.config import Pool
    from airflow_delta_occ.pools.requests import LeaseRequest

#: ``operation=`` -> the planner's operation (``airflow_delta_occ.engine.planner.Operation`` values):
#: the provider's job operations, then the planner's own for writers the operators do not cover.
SENSOR_OPERATIONS: Mapping[str, str] = {
    **{operation.value: operation.engine_name for operation in JobOperation},
    **{name.lower(): name for name in ("OPTIMIZE_ZORDER", "OVERWRITE", "INSERT_SELF_READ", "SET_PROPERTIES",
                                       "SCHEMA_CHANGE")},
}
#: Operations whose new files land only where ``partitions=`` pins them (they read no partition to write).
_PLACED_BY_PARTITIONS = frozenset({"MERGE", "INSERT", "INSERT_SELF_READ"})
#: Stands for the properties of a ``set_properties`` writer that did not name them: a change of an
#: unknown property conflicts with every concurrent writer (none can be rebased over it).
UNKNOWN_PROPERTIES: Mapping[str, str] = {"airflow_delta_occ.sensor.unknown_properties": "unknown"}


def sensor_operation(operation: Any) -> str:
    """The planner's operation for ``operation=`` (case-insensitive).

    Raises:
        JobSpecError: not one of SENSOR_OPERATIONS, naming them.
    """
    key = operation.strip().lower() if isinstance(operation, str) else ""
    if key not in SENSOR_OPERATIONS:
        raise JobSpecError(f"operation must be one of {', '.join(SENSOR_OPERATIONS)}, got {operation!r}")
    return SENSOR_OPERATIONS[key]


class DeltaConflictSensor(BaseSensorOperator):
    """Waits (deferred) until the conflict pool grants a lease on a writer's footprint, then holds it.

    :param table: the table the downstream writer writes (path or URI).
    :param operation: what the writer does: ``merge``, ``update``, ``delete``, ``optimize``, ``append``,
        ``overwrite_partitions``, ``optimize_zorder``, ``overwrite``, ``insert_self_read``,
        ``set_properties`` or ``schema_change``.
    :param conflict_pool: the pool of the pool file (``[delta_occ] pool_file``) the table is in.
    :param partitions: the partitions the writer is confined to (``{"date": "{{ ds }}"}``), typed by
        the table's schema as for the operators; none: the whole table.
    :param condition: an extra SQL predicate on the target the writer reads or rewrites (ANDed).
    :param properties: the table properties a ``set_properties`` writer sets; without them it is
        taken to change a property no concurrent writer can be rebased over (it conflicts with all).
    :param lease_ttl: seconds the lease lives after the grant (nobody renews it): at least the
        writer's run time. Default: the pool's ``lease_ttl``.
    :param lease_conn_id: the ``delta_occ_leases`` connection of the lease store.
    :param storage_conn_id: the connection with the credentials of the table's object store (see the
        operators); default: the ``storage_conn_id`` extra of the ``delta_conn_id`` connection, as for
        the writer the sensor guards; without either the store's default credential chain reads the log.
    :param delta_conn_id: the ``delta_occ`` connection whose ``storage_conn_id`` extra applies when
        ``storage_conn_id`` is not given (the operators' default connection unless set).
    :param poke_interval: seconds between the trigger's polls of the store.
    :param timeout: (``BaseSensorOperator``) seconds to wait for the grant; then the sensor fails (or
        skips with ``soft_fail``) after cancelling its request.

    XCom: ``{"pool", "request_id", "owner", "table", "waited", "waited_for", "expires_in"}``, what
    ``DeltaLeaseReleaseOperator`` needs to release the lease; ``expires_in`` is the seconds the lease
    lives from the hand-over unless released.
    """

    template_fields: Sequence[str] = ("table", "partitions", "condition", "properties")
    template_fields_renderers: ClassVar[dict[str, str]] = {"partitions": "json", "condition": "sql",
                                                           "properties": "json"}
    ui_color = "#00add4"

    def __init__(self, *, table: str, operation: str, conflict_pool: str,
                 partitions: Mapping[str, Any] | str | None = None, condition: str | None = None,
                 properties: Mapping[str, str] | None = None, lease_ttl: float | None = None,
                 lease_conn_id: str = DeltaLeaseStoreHook.default_conn_name, poke_interval: float = 5.0,
                 storage_conn_id: str | None = None, delta_conn_id: str | None = "delta_occ_default",
                 **kwargs: Any) -> None:
        # Everything that does not need the table is checked when the DAG file is parsed.
        if not isinstance(table, str) or not table.strip():
            raise JobSpecError(f"table must be a non-empty path or URI, got {table!r}")
        planner_operation = sensor_operation(operation)
        if not isinstance(conflict_pool, str) or not conflict_pool.strip():
            raise JobSpecError(f"conflict_pool must name a pool of the pool file, got {conflict_pool!r}")
        partitions_mapping(partitions, rendered=False)
        if condition is not None and not templated(condition):
            parse_expression(condition, "condition")
        if properties is not None and not isinstance(properties, Mapping):
            raise JobSpecError(f"properties must be a mapping of property to value, got {properties!r}")
        if lease_ttl is not None and (isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float)
                                      or not lease_ttl > 0):
            raise JobSpecError(f"lease_ttl must be a positive number of seconds, got {lease_ttl!r}")
        route_to_airflow_pool(kwargs, kwargs.get("default_args"), conflict_pool)
        check_pooled_literal(conflict_pool, table)
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.table = table
        self.operation = operation
        self.planner_operation = planner_operation
        self.conflict_pool = conflict_pool
        self.partitions = partitions
        self.condition = condition
        self.properties = dict(properties) if properties is not None else None
        self.lease_ttl = float(lease_ttl) if lease_ttl is not None else None
        self.lease_conn_id = lease_conn_id
        self.storage_conn_id = storage_conn_id
        self.delta_conn_id = delta_conn_id

    # -- the footprint ----------------------------------------------------------------------------
    def footprint(self, snapshot: Snapshot) -> Footprint:
        """The writer's footprint on ``snapshot``, as described by the sensor's (rendered) arguments.

        Raises:
            PartitionSpecError, UnsafeExpressionError: ``partitions`` or ``condition`` is not valid here.
        """
        from airflow_delta_occ.engine.planner import plan_footprint
        from airflow_delta_occ.jobs.footprint import partition_combinations

        pfilter = build_partition_filter(snapshot.schema, snapshot.partition_columns,
                                         partitions_mapping(self.partitions))
        extra = parse_expression(self.condition, "condition") if self.condition is not None else None
        predicate = conjoin_exprs(pfilter.to_expr(), extra)
        writes = (partition_combinations(snapshot, pfilter.serialized())
                  if self.planner_operation in _PLACED_BY_PARTITIONS else None)
        properties = self.properties if self.properties is not None else UNKNOWN_PROPERTIES
        return plan_footprint(snapshot, self.planner_operation,
                              None if self.planner_operation == "INSERT" else predicate,
                              label=f"{self.operation} {self.task_id}", write_partitions=writes,
                              properties=properties if self.planner_operation == "SET_PROPERTIES" else None)

    def lease_request(self, pool: Pool, owner: str) -> LeaseRequest:
        """The request for the writer's footprint on the table's current snapshot.

        Raises:
            TableNotFoundError: the table has no Delta log; PoolConfigError: it is not in the pool.
        """
        from airflow_delta_occ.engine import DeltaLog
        from airflow_delta_occ.hooks.delta import DeltaSparkHook

        table = pooled_table(pool, self.table)
        # The same storage connection the guarded writer's hook resolves (its own, or the delta_occ one's).
        hook = DeltaSparkHook(self.delta_conn_id, storage_conn_id=self.storage_conn_id)
        credentials = hook.credentials_for(self.table)
        snapshot = DeltaLog.for_table(self.table, credentials=credentials).snapshot()
        return holding.request_for(pool, table=table, owner=owner, footprint=self.footprint(snapshot),
                                   snapshot=snapshot, ttl=self.lease_ttl)

    # -- waiting ----------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        """Ask for the lease: succeed holding it when granted, else defer until it is."""
        from airflow_delta_occ.triggers.lease import DeltaLeaseTrigger, settle_seconds

        pool = required_pool(self.conflict_pool)
        owner = lease_owner(context)
        request = self.lease_request(pool, owner)
        with DeltaLeaseStoreHook(self.lease_conn_id).get_store() as store:
            state = store.acquire(request)
        if state.granted:
            expires_in = (state.record.expires_at - state.checked_at if state.record is not None
                          else request.ttl)
            return self._handed_over(request.pool, state.request_id, owner, expires_in, state.waited or 0.0, [])
        self.log.info("conflict pool %s: lease request %s on %s waits for %s", pool.name, state.request_id,
                      request.table, holding.describe_wait(state))
        timeout = timedelta(seconds=float(self.timeout)) if self.timeout is not None else None
        seen = holding.BlockersSeen()   # whom it waits for now: named at the grant even if gone by the first poll
        seen.update(state.blockers)
        holding.show_wait(context["ti"], holding.wait_record(pool.name, request.table, state), self.log)
        self.defer(trigger=DeltaLeaseTrigger(lease_conn_id=self.lease_conn_id, request_id=state.request_id,
                                             owner=owner, request=request.to_json(),
                                             poll_interval=float(self.poke_interval), settle=settle_seconds(),
                                             blockers_seen=seen.seen()),
                   method_name="execute_complete", timeout=timeout)
        raise AssertionError("defer() returns only by raising")  # pragma: no cover

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
        """The trigger saw the grant: renew the lease (its TTL ran since the grant, so it starts again at
        the hand-over) and succeed holding it; a lease that expired before the sensor resumed is asked
        for again.

        Raises:
            LeaseStoreError: the trigger reported an error instead of a grant (the request is cancelled).
            TaskDeferred: the lease expired before the resumption and must be waited for again.
        """
        owner = lease_owner(context)
        if not event or event.get("status") != "granted":
            message = (event or {}).get("message") or f"unexpected lease trigger event {event!r}"
            self.cancel_requests(owner, (event or {}).get("request_id"))
            raise LeaseStoreError(f"conflict pool {self.conflict_pool!r}: waiting for a lease failed: {message}")
        request_id = str(event["request_id"])
        try:
            with DeltaLeaseStoreHook(self.lease_conn_id).get_store() as store:
                record = store.renew(request_id, owner)
        except LeaseLostError as exc:
            self.log.warning("conflict pool %s: the granted lease %s expired before the sensor resumed (%s); "
                             "asking again", self.conflict_pool, request_id, exc)
            return self.execute(context)
        from airflow_delta_occ.pools.requests import utc_text  # loads the engine: not at DAG parse time

        self.log.info("conflict pool %s: lease %s renewed at the hand-over, until %s (the store's clock)",
                      self.conflict_pool, request_id, utc_text(record.expires_at))
        ttl = self.lease_ttl or required_pool(self.conflict_pool).lease_ttl  # renewed: the whole TTL
        return self._handed_over(self.conflict_pool, request_id, owner, ttl,
                                 float(event.get("waited") or 0.0),
                                 holding.blocker_names(event.get("blockers_seen") or []))

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Any) -> Any:
        """A deferral that ended without an event (the sensor's ``timeout``, a trigger that failed) resumes
        here with ``__fail__``: cancel the waiting request first (the triggerer does not call the
        trigger's ``on_kill`` on a timeout), then fail (or skip, with ``soft_fail``) as any sensor does."""
        if next_method == TRIGGER_FAIL_REPR:
            self.cancel_requests(lease_owner(context))
        return super().resume_execution(next_method, next_kwargs, context)

    def cancel_requests(self, owner: str, request_id: str | None = None) -> None:
        """Cancel ``request_id`` and every other live request of ``owner`` (this sensor try) on the table,
        quietly: a failure is logged (the request is then abandoned after its TTL without heartbeats),
        never raised over the error that ended the wait."""
        try:
            table = pooled_table(required_pool(self.conflict_pool), self.table)
            with DeltaLeaseStoreHook(self.lease_conn_id).get_store() as store:
                holding.cancel_requests(store, owner, [str(request_id)] if request_id else [], table=table,
                                        log=self.log)
        except (DeltaJobError, AirflowNotFoundException) as exc:
            self.log.error("conflict pool %s: could not cancel the lease requests of %s on %s (they are "
                           "abandoned after their TTL): %s", self.conflict_pool, owner, self.table, exc)

    def _handed_over(self, pool: str, request_id: str, owner: str, expires_in: float, waited: float,
                     waited_for: list[str]) -> dict[str, Any]:
        self.log.info("conflict pool %s: lease %s on %s granted to %s (waited %.3f s for %s); it expires in "
                      "%.0f s unless released", pool, request_id, self.table, owner, waited,
                      waited_for or "nobody", expires_in)
        return {"pool": pool, "request_id": request_id, "owner": owner, "table": self.table,
                "waited": round(waited, 3), "waited_for": waited_for, "expires_in": round(expires_in, 3)}

    def poke(self, context: Any) -> bool:
        """Not used: the sensor always waits deferred (polling from a worker would hold a slot and,
        asking anew each time, lose its place in line)."""
        raise NotImplementedError("DeltaConflictSensor always defers; execute() waits for the lease")


class DeltaLeaseReleaseOperator(BaseOperator):
    """Releases the lease a ``DeltaConflictSensor`` handed over, once the writer it guarded is done.

    :param sensor_task_id: the sensor whose XCom names the lease.
    :param lease: the XCom itself instead (templated), e.g. from a mapped sensor.
    :param lease_conn_id: the ``delta_occ_leases`` connection of the lease store.

    Runs with ``trigger_rule="all_done"`` by default: after the writer, whether it succeeded or failed.
    Without a lease (the sensor failed or was skipped) it has nothing to do. A lease already gone (its
    TTL ran out) is logged; a store that cannot be reached fails the task (the lease then ends with its
    TTL). Returns whether a held lease was released.
    """

    template_fields: Sequence[str] = ("lease",)
    ui_color = "#00add4"

    def __init__(self, *, sensor_task_id: str | None = None, lease: Mapping[str, Any] | str | None = None,
                 lease_conn_id: str = DeltaLeaseStoreHook.default_conn_name, trigger_rule: str = "all_done",
                 **kwargs: Any) -> None:
        if (sensor_task_id is None) == (lease is None):
            raise JobSpecError("DeltaLeaseReleaseOperator needs exactly one of sensor_task_id= or lease=")
        super().__init__(trigger_rule=trigger_rule, **kwargs)
        self.sensor_task_id = sensor_task_id
        self.lease = lease
        self.lease_conn_id = lease_conn_id

    def execute(self, context: Any) -> bool:
        lease = self.lease if self.lease is not None else context["ti"].xcom_pull(task_ids=self.sensor_task_id)
        if not lease:
            self.log.info("no lease to release (the sensor %s holds none)", self.sensor_task_id)
            return False
        if not isinstance(lease, Mapping) or not lease.get("request_id") or not lease.get("owner"):
            raise JobSpecError(f"not a lease handed over by DeltaConflictSensor: {lease!r}")
        with DeltaLeaseStoreHook(self.lease_conn_id).get_store() as store:
            released = bool(store.release(str(lease["request_id"]), str(lease["owner"])))
        self.log.info("lease %s of %s on %s %s", lease["request_id"], lease["owner"], lease.get("table"),
                      "released" if released else "was already gone (its TTL ran out)")
        return released
