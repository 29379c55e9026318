"""Every option of the ``[delta_occ]`` config section, read and checked in one place.

The options are declared (with descriptions and defaults) in ``get_provider_info``; this module is
the only code that reads them, so a malformed value fails with one ``ProviderConfigError`` naming
the option, wherever it is used.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Literal

from airflow_delta_occ.exceptions import PoolConfigError, ProviderConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.pools.config import PoolConfig

SECTION = "delta_occ"
MODES = ("embedded", "spark-submit", "connect")
DEFAULT_TASK_RETRIES = 2
MAX_TASK_RETRIES = 100

# The last pool file loaded, keyed by path, with its (mtime, size) when read: the scheduler asks often.
_pool_cache: dict[str, tuple[tuple[int, int], PoolConfig]] = {}


def _get(option: str, fallback: str) -> str:
    from airflow.sdk import conf  # read lazily: importing the provider must not load Airflow's config

    return str(conf.get(SECTION, option, fallback=fallback) or "")


def default_mode() -> str:
    """``[delta_occ] default_mode``: where jobs run when no ``delta_occ`` connection says otherwise.

    Raises:
        ProviderConfigError: not one of ``embedded``, ``spark-submit``, ``connect``.
    """
    mode = _get("default_mode", "embedded").strip() or "embedded"
    if mode not in MODES:
        raise ProviderConfigError(f"[{SECTION}] default_mode is {mode!r}; expected one of {', '.join(MODES)}")
    return mode


def conflict_policies() -> dict[str, dict[str, Any]]:
    """``[delta_occ] conflict_policies``: the platform's policy defaults, JSON in the operator's format.

    Raises:
        ProviderConfigError: not JSON, or an unknown conflict, action or field.
    """
    from airflow_delta_occ.retry.policy import layer_overrides

    text = _get("conflict_policies", "")
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("expected a JSON object keyed by exception name")
        return layer_overrides(value)
    except (ValueError, TypeError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        raise ProviderConfigError(f"[{SECTION}] conflict_policies: {exc}") from exc


def task_retries() -> int:
    """``[delta_occ] task_retries``: Airflow ``retries`` of a Delta task that sets none (default 2).

    A task-level conflict retry can only happen within ``retries``; Airflow's own default is 0.

    Raises:
        ProviderConfigError: not a whole number from 0 to 100.
    """
    text = _get("task_retries", str(DEFAULT_TASK_RETRIES)).strip()
    if not text.isascii() or not text.isdigit() or int(text) > MAX_TASK_RETRIES:
        raise ProviderConfigError(f"[{SECTION}] task_retries is {text!r}; expected a whole number from 0 to "
                                  f"{MAX_TASK_RETRIES}")
    return int(text)


MAX_WORKER_WAIT_SECONDS = 86_400.0
DEFAULT_MIN_HEARTBEAT_INTERVAL = 5.0   # Airflow's own default for [workers] min_heartbeat_interval


def worker_exit_notice() -> float:
    """Airflow's ``[workers] min_heartbeat_interval`` (seconds; its default 5 when unset or unreadable):
    how long a worker's supervisor may sleep before it notices that its task process ended, so how late
    the scheduler may learn that a deferring task's process exited (``triggers.lease.settle_seconds``).
    Airflow's option, not this provider's: a malformed value is Airflow's to report, so the default
    stands in for it here."""
    from airflow.sdk import conf

    try:
        value = float(conf.get("workers", "min_heartbeat_interval", fallback=str(DEFAULT_MIN_HEARTBEAT_INTERVAL)))
    except (TypeError, ValueError):
        return DEFAULT_MIN_HEARTBEAT_INTERVAL
    return value if 0 <= value <= MAX_WORKER_WAIT_SECONDS else DEFAULT_MIN_HEARTBEAT_INTERVAL


def worker_wait() -> float:
    """``[delta_occ] worker_wait``: the longest expected wait (seconds) a pooled task without
    ``deferrable=`` spends in the worker before it defers (default 30; 0: always deferred).

    Raises:
        ProviderConfigError: not a number of seconds from 0 to a day.
    """
    from airflow_delta_occ.pools.holding import WORKER_WAIT_SECONDS

    text = _get("worker_wait", str(WORKER_WAIT_SECONDS)).strip()
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_WORKER_WAIT_SECONDS:   # also refuses nan
        raise ProviderConfigError(f"[{SECTION}] worker_wait is {text!r}; expected seconds from 0 to "
                                  f"{MAX_WORKER_WAIT_SECONDS:.0f}")
    return value


DEFAULT_EARLY_ABORT_INTERVAL = 1.0
MIN_EARLY_ABORT_INTERVAL = 0.1   # below it the watch would poll the object store in a busy loop
MAX_EARLY_ABORT_INTERVAL = 60.0


def early_abort() -> bool:
    """``[delta_occ] early_abort``: whether a Delta task watches its table while its job runs and stops the job
    as soon as a commit that landed makes its own commit certain to fail (default True; a task's
    ``early_abort=`` overrides it).

    Raises:
        ProviderConfigError: not a boolean.
    """
    return _flag("early_abort", default=True)


def early_abort_interval() -> float:
    """``[delta_occ] early_abort_interval``: seconds between two looks at the table's log while a job runs
    (default 1; one read of the next commit file each).

    Raises:
        ProviderConfigError: not a number of seconds from 0.1 to 60.
    """
    text = _get("early_abort_interval", str(DEFAULT_EARLY_ABORT_INTERVAL)).strip()
    try:
        return check_early_abort_interval(float(text), f"[{SECTION}] early_abort_interval")
    except ValueError as exc:
        raise ProviderConfigError(f"[{SECTION}] early_abort_interval is {text!r}; expected seconds from "
                                  f"{MIN_EARLY_ABORT_INTERVAL:g} to {MAX_EARLY_ABORT_INTERVAL:g}") from exc


def check_early_abort_interval(value: object, what: str) -> float:
    """``value`` as the seconds between two looks at the log.

    Raises:
        ProviderConfigError: not a number from ``MIN_EARLY_ABORT_INTERVAL`` to ``MAX_EARLY_ABORT_INTERVAL``
            (naming ``what``; NaN and infinity included).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not MIN_EARLY_ABORT_INTERVAL <= value <= MAX_EARLY_ABORT_INTERVAL:
        raise ProviderConfigError(f"{what} must be seconds from {MIN_EARLY_ABORT_INTERVAL:g} to "
                                  f"{MAX_EARLY_ABORT_INTERVAL:g}, got {value!r}")
    return float(value)


def default_deferrable() -> bool | None:
    """``True`` when Airflow's ``[operators] default_deferrable`` is set to True, else ``None``.

    The official providers' operators take that option as their ``deferrable`` default, and a pooled
    Delta task does too when it is True: every wait then defers. Its default, False, cannot be told
    from a choice (Airflow 3 writes ``default_deferrable = false`` into every new airflow.cfg), so it
    leaves the task's wait adaptive (``pools.holding.WaitRule``) rather than forcing every wait into
    the worker; ``deferrable=False`` on a task does that.

    Raises:
        ProviderConfigError: not a boolean.
    """
    from airflow.sdk import conf

    text = str(conf.get("operators", "default_deferrable", fallback="False")).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return None
    raise ProviderConfigError(f"[operators] default_deferrable is {text!r}; expected True or False")


_TRUE = ("true", "t", "yes", "y", "on", "1")
_FALSE = ("false", "f", "no", "n", "off", "0", "")


def _flag(option: str, default: bool = False) -> bool:
    """A boolean option (``default`` when it is not set); read like Airflow's ``conf.getboolean``.

    Raises:
        ProviderConfigError: not one of true/false, yes/no, on/off, 1/0 (any case).
    """
    text = _get(option, str(default)).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ProviderConfigError(f"[{SECTION}] {option} is {text!r}; expected True or False")


def assign_pools() -> bool:
    """``[delta_occ] assign_pools``: the cluster policy gives a Delta task without ``conflict_pool=``
    the pool its (static) table belongs to in the pool file (default False).

    Raises:
        ProviderConfigError: not a boolean.
    """
    return _flag("assign_pools")


def enforce_pools() -> bool:
    """``[delta_occ] enforce_pools``: the cluster policy moves a Delta task of a conflict pool into the
    pool's Airflow pool even when its author chose another ``pool=`` (default False: it warns).

    Raises:
        ProviderConfigError: not a boolean.
    """
    return _flag("enforce_pools")


UnsafeS3Commits = Literal["refuse", "warn"]
UNSAFE_S3_COMMITS: tuple[UnsafeS3Commits, ...] = ("refuse", "warn")


def unsafe_s3_commits() -> UnsafeS3Commits:
    """``[delta_occ] unsafe_s3_commits``: what a job does when its commits to an S3 table could be lost
    (each job starts its own driver and no multi-driver LogStore is configured): ``refuse`` (default)
    or ``warn`` (the platform guarantees one writer per table at a time).

    Raises:
        ProviderConfigError: not ``refuse`` or ``warn``.
    """
    value = _get("unsafe_s3_commits", "refuse").strip().lower() or "refuse"
    for choice in UNSAFE_S3_COMMITS:
        if value == choice:
            return choice
    raise ProviderConfigError(f"[{SECTION}] unsafe_s3_commits is {value!r}; expected refuse or warn")


def pool_file() -> str | None:
    """``[delta_occ] pool_file``: path of the TOML file that defines the conflict pools; None when unset."""
    return _get("pool_file", "").strip() or None


def pool_config() -> PoolConfig | None:
    """The conflict pools of ``[delta_occ] pool_file``, or None when the option is empty.

    The scheduler and the triggerer ask on every lease decision, so the parsed file is kept until
    its modification time or size changes: an edited file is picked up without a restart.

    Raises:
        PoolConfigError: the file cannot be read or defines unusable pools.
    """
    from airflow_delta_occ.pools.config import load_pool_config

    path = pool_file()
    if path is None:
        return None
    try:
        stat = os.stat(path)
        stamp: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
    except OSError:
        stamp = None  # load_pool_config reports it
    cached = _pool_cache.get(path)
    if stamp is not None and cached is not None and cached[0] == stamp:
        return cached[1]
    try:
        config = load_pool_config(path)
    except PoolConfigError as exc:
        raise PoolConfigError(f"[{SECTION}] pool_file: {exc}") from exc
    _pool_cache.clear()
    if stamp is not None:  # stat before reading: a change while reading only costs one more read
        _pool_cache[path] = (stamp, config)
    return config
