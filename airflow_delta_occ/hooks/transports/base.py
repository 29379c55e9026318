"""``JobTransport``: how a ``JobSpec`` reaches Spark and its ``JobResult`` comes back, one class per mode.

``DeltaSparkHook`` picks one transport, once, from its mode, and keeps what every mode shares (the
connection, object storage, the Spark UI link, decoding the result into the job's exception,
``JobKilledError``). A transport does only what differs between the modes: run a job, stop it,
look a catalog table up where the jobs run, and test the connection.

Built in: ``embedded``, ``spark-submit``, ``connect``, and ``MemoryTransport`` (no Spark: for unit
tests of operators and DAGs), which a test installs under a mode name with ``register_transport``
(or ``MemoryTransport.registered``) and selects with the connection extra ``mode``.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from airflow_delta_occ.exceptions import ProviderConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.jobs.result import JobResult
    from airflow_delta_occ.jobs.spec import JobSpec
    from airflow_delta_occ.spark.early_abort import TableWatch
    from airflow_delta_occ.spark.storage import SparkStorageSettings


class TransportHost(Protocol):
    """What a transport reads from the hook that owns it (``DeltaSparkHook`` is one)."""

    @property
    def delta_conn_id(self) -> str | None: ...

    @property
    def extras(self) -> Mapping[str, Any]: ...

    @property
    def spark_conf(self) -> Mapping[str, str]: ...

    @property
    def log(self) -> Any: ...

    @property
    def storage(self) -> SparkStorageSettings: ...

    def conf_with_storage(self, base: Mapping[str, str]) -> dict[str, str]: ...

    def get_connection(self, conn_id: str) -> Any: ...


@dataclass(frozen=True)
class TableDescription:
    """Where a catalog table lives and its format (``DESCRIBE DETAIL``, wherever the jobs run)."""

    location: str
    format: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TableDescription:
        """From the runner's ``describe_table`` answer (``{"location", "format"}``)."""
        return cls(location=str(row["location"]), format=str(row["format"]))


@dataclass(frozen=True)
class RunningJob:
    """What ``JobTransport.kill`` stops: the job's session and tag, or its spark-submit hook."""

    mode: str
    tag: str
    session: Any = None
    submit: Any = None


class JobTransport(ABC):
    """Runs jobs for one ``DeltaSparkHook`` in one mode.

    ``run`` returns the runner's ``JobResult`` as it came back (the hook decodes its status);
    ``kill``, called from another thread (the Task SDK's SIGTERM handler), stops the job ``run`` is
    executing and says whether there was one.
    """

    #: The mode's name (the connection extra ``mode``).
    mode: str = ""
    #: Whether every job runs in one long-lived driver (Spark Connect's server), so delta-spark's
    #: default S3 LogStore keeps commits exclusive; ``False``: a driver per job (see ``use_storage``).
    one_driver: bool = False
    #: Whether ``warm_up`` only loads code (it opens no session and reads no setting), so it can start
    #: with the task, before the job is planned and its storage settings are known. A mode opts in.
    light_warm_up: bool = False

    def __init__(self, host: TransportHost) -> None:
        self.host = host
        self.log = host.log
        #: The job ``run`` is executing (``None`` between jobs).
        self.running: RunningJob | None = None
        #: Whether ``kill`` stopped the last job (reset by the hook before each job).
        self.killed = False

    @abstractmethod
    def run(self, spec: JobSpec, *, watch: TableWatch | None = None) -> JobResult:
        """Execute ``spec``; its outcome, whatever it is, comes back as the result's status. With ``watch``,
        each attempt is watched for early abort (``spark.early_abort``) where the runner runs."""

    def warm_up(self) -> None:  # noqa: B027 - a mode with nothing to start early does nothing
        """Start what a job will need (a session, a client) before it runs; may run in another thread."""

    def kill(self) -> bool:
        """Stop the job ``run`` is executing; ``False`` when none runs (nothing is done).

        ``killed`` is set before the job is stopped, so a ``run`` that fails because of the stop is
        known to have been killed.
        """
        running = self.running
        if running is None:
            return False
        self.killed = True
        self._stop(running)
        return True

    def _stop_if_interrupted(self, exc: BaseException) -> None:
        """Stop the job's Spark work when something other than the job's own outcome unwinds through it.

        ``execution_timeout`` raises ``AirflowTaskTimeout`` (a ``BaseException``) inside the wait,
        and the Task SDK calls ``on_kill`` only after ``execute`` has returned, when no job is
        tracked any more: a spark-submit driver or the session's jobs would go on and could still
        commit. An ordinary ``Exception`` is the job's own failure and needs no stop.
        """
        if not isinstance(exc, Exception) and self.running is not None:
            self.log.warning("%s while the %s job ran: stopping its Spark work", type(exc).__name__, self.mode)
            self.kill()

    @abstractmethod
    def _stop(self, running: RunningJob) -> None:
        """Stop ``running``'s Spark work (never raises for a job already gone)."""

    @abstractmethod
    def describe_table(self, name: str) -> TableDescription:
        """Where catalog table ``name`` lives and its format, in the catalog the jobs run against.

        Raises:
            TableNotFoundError: no such table.
        """

    @abstractmethod
    def test_connection(self) -> tuple[bool, str]:
        """The connection form's test button for this mode (may raise: the hook reports the error)."""

    def bind(self, host: TransportHost) -> JobTransport:
        """Serve ``host`` (a transport built before its hook, given as ``DeltaSparkHook(transport=...)``)."""
        self.host, self.log = host, host.log
        return self

    def default_ui_url(self) -> str | None:
        """The Spark UI to link when neither the connection nor the driver names one."""
        return None

    def get_spark(self) -> Any:
        """A SparkSession in the worker (modes that have none refuse)."""
        raise ProviderConfigError(f"the {self.mode} transport has no Spark session in the worker")

    def job_session(self) -> Any:
        """A context manager giving the session one job runs in (modes that have none refuse)."""
        raise ProviderConfigError(f"the {self.mode} transport has no Spark session in the worker")


TransportFactory = Callable[[TransportHost], JobTransport]
"""Builds a hook's transport; called once per hook, with the hook."""

BUILTIN_TRANSPORTS: Mapping[str, str] = {
    "embedded": "airflow_delta_occ.hooks.transports.embedded:EmbeddedTransport",
    "spark-submit": "airflow_delta_occ.hooks.transports.submit:SubmitTransport",
    "connect": "airflow_delta_occ.hooks.transports.connect:ConnectTransport",
}
_registered: dict[str, TransportFactory] = {}
_lock = threading.Lock()


def register_transport(mode: str, factory: TransportFactory) -> None:
    """Run the jobs of every ``DeltaSparkHook`` whose mode is ``mode`` through ``factory(hook)``.

    The mode is then accepted in a ``delta_occ`` connection's ``mode`` extra and in
    ``DeltaSparkHook(mode=...)``. The built-in modes cannot be replaced; registering a name again
    replaces the earlier factory.

    Raises:
        ProviderConfigError: ``mode`` is a built-in mode or empty.
    """
    if not mode or mode in BUILTIN_TRANSPORTS:
        raise ProviderConfigError(f"cannot register a transport as mode {mode!r}: "
                                  f"the built-in modes are {', '.join(BUILTIN_TRANSPORTS)}")
    with _lock:
        _registered[mode] = factory


def unregister_transport(mode: str) -> None:
    """Forget a mode ``register_transport`` added (nothing happens for an unknown one)."""
    with _lock:
        _registered.pop(mode, None)


def registered_modes() -> tuple[str, ...]:
    """The modes ``register_transport`` added (the built-in ones are ``config.MODES``)."""
    with _lock:
        return tuple(_registered)


def transport_factory(mode: str) -> TransportFactory | None:
    """The factory of ``mode``: a built-in transport class or a registered factory (``None``: unknown)."""
    target = BUILTIN_TRANSPORTS.get(mode)
    if target is not None:
        module, name = target.split(":")
        factory: TransportFactory = getattr(importlib.import_module(module), name)
        return factory
    with _lock:
        return _registered.get(mode)
