"""``MemoryTransport``: a transport without Spark, for unit tests of operators and DAGs.

It records every ``JobSpec`` it is given and answers with the outcomes the test chose: a function of
the spec, or a queue of ``JobResult``s and exceptions taken in order (empty: a success that committed
nothing). The result goes through the same decoding as a real job's, so a ``CONFLICT`` result raises
the typed conflict exactly as Spark's would. Install it under a mode name and point a connection at
that mode; the operators then build their hook as usual and run through it::

    transport = MemoryTransport([MemoryTransport.success()])   # a DELETE that matched nothing
    with transport.registered("memory"):
        monkeypatch.setenv("AIRFLOW_CONN_DELTA_OCC_DEFAULT",
                           json.dumps({"conn_type": "delta_occ", "extra": {"mode": "memory"}}))
        result = DeltaDeleteOperator(...).execute(context)
    assert transport.specs[0].operation == "delete"

The operator still confirms a reported ``version`` in the table's Delta log, as after a real job: a
result with a version needs that commit in the log (made by the test, e.g. with the engine).

``DeltaSparkHook(transport=...)`` takes a transport directly, for code that builds its own hook.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_delta_occ.hooks.transports.base import (
    JobTransport,
    RunningJob,
    TableDescription,
    TransportHost,
    register_transport,
    unregister_transport,
)
from airflow_delta_occ.jobs.result import JobResult, JobStatus

if TYPE_CHECKING:
    from airflow_delta_occ.jobs.spec import JobSpec
    from airflow_delta_occ.spark.early_abort import TableWatch

Outcome = JobResult | BaseException
Handler = Callable[["JobSpec"], JobResult]


class MemoryTransport(JobTransport):
    """Runs nothing; returns the outcomes it was given and remembers what it was asked.

    Args:
        outcomes: a function ``spec -> JobResult`` (it may raise, or block: ``kill`` sets
            ``kill_requested``, which it can wait on), or ``JobResult``s and exceptions returned or
            raised one per job, in order. A result's ``table`` and ``operation`` are the spec's when
            the test left them empty (see ``success``).
        tables: what ``table_location`` finds: catalog name -> location (a Delta table), or a
            ``TableDescription`` for another format.
        connection: what the connection's test button reports.

    Attributes:
        specs: every spec ``run`` was given, in order.
        kills: how many times ``kill`` stopped a running job.
        kill_requested: set by ``kill`` while a job runs (cleared when the next job starts).
        hosts: the hooks the transport served.
    """

    mode = "memory"
    one_driver = True  # nothing is written: no S3 commit to lose
    light_warm_up = True  # it counts warm-ups (``warm_ups``); a test may set False to act as embedded

    def __init__(self, outcomes: Handler | Iterable[Outcome] = (), *,
                 tables: Mapping[str, str | TableDescription] | None = None,
                 connection: tuple[bool, str] = (True, "memory: jobs run in memory (no Spark)")) -> None:
        self.host: Any = None
        self.log = None
        self.running: RunningJob | None = None
        self.killed = False
        self._handler: Handler | None = outcomes if callable(outcomes) else None
        self._queue: deque[Outcome] = deque(() if callable(outcomes) else outcomes)
        self.tables = dict(tables or {})
        self.connection = connection
        self.specs: list[JobSpec] = []
        self.watches: list[TableWatch | None] = []   # what each run was given for early abort
        self.kills = 0
        self.warm_ups = 0
        self.kill_requested = threading.Event()
        self.hosts: list[TransportHost] = []
        self._lock = threading.Lock()

    # -- installing -------------------------------------------------------------------------------
    def bind(self, host: TransportHost) -> MemoryTransport:
        """This transport as ``host``'s (the factory ``register_transport`` is given)."""
        with self._lock:
            self.hosts.append(host)
            self.host, self.log = host, host.log
        return self

    @contextlib.contextmanager
    def registered(self, mode: str = "memory") -> Iterator[MemoryTransport]:
        """Serve every hook whose mode is ``mode`` while the block runs."""
        register_transport(mode, self.bind)
        try:
            yield self
        finally:
            unregister_transport(mode)

    def add(self, *outcomes: Outcome) -> None:
        """Queue more outcomes (for a transport built from a queue)."""
        with self._lock:
            self._queue.extend(outcomes)

    @staticmethod
    def success(**fields: Any) -> JobResult:
        """A successful result; ``table`` and ``operation`` are filled from the spec when left out."""
        return JobResult(status=fields.pop("status", JobStatus.SUCCESS), table=fields.pop("table", ""),
                         operation=fields.pop("operation", ""), **fields)

    # -- the transport ----------------------------------------------------------------------------
    def warm_up(self) -> None:
        with self._lock:   # called from the operator's warm-up thread
            self.warm_ups += 1

    def run(self, spec: JobSpec, *, watch: TableWatch | None = None) -> JobResult:
        with self._lock:
            self.specs.append(spec)
            self.watches.append(watch)
            outcome: Outcome | None = None if self._handler is not None or not self._queue else self._queue.popleft()
        self.kill_requested.clear()
        self.running = RunningJob(self.mode, f"delta-occ-memory-{uuid.uuid4().hex}")
        try:
            if self._handler is not None:
                outcome = self._handler(spec)
        finally:
            self.running = None
        if isinstance(outcome, BaseException):
            raise outcome
        result = outcome if outcome is not None else self.success()
        result = replace(result, table=result.table or spec.target.label, operation=result.operation or spec.operation)
        return JobResult.from_json(result.to_json())  # as every mode's result travels

    def _stop(self, running: RunningJob) -> None:
        with self._lock:
            self.kills += 1
        self.kill_requested.set()

    def describe_table(self, name: str) -> TableDescription:
        from airflow_delta_occ.engine.errors import TableNotFoundError

        found = self.tables.get(name)
        if found is None:
            raise TableNotFoundError(name, "no such table in the memory transport")
        return TableDescription(location=found, format="delta") if isinstance(found, str) else found

    def test_connection(self) -> tuple[bool, str]:
        return self.connection
