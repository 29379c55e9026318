"""What goes into a lease store and what comes out: requests, lease records, states and audit events.

Everything here is plain data with a JSON form, so a trigger in the triggerer can carry a request
and a CLI can print a listing without importing Spark or reading the table.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from airflow_delta_occ.engine.errors import FootprintDecodeError
from airflow_delta_occ.engine.planner import MODELS, Footprint, Model, TableState
from airflow_delta_occ.exceptions import LeaseError

from .compare import PlannedJob, Reach, compact, reach

MAX_OWNER_LENGTH = 512
MAX_TABLE_LENGTH = 2048
MAX_SECONDS = 1e9                # a TTL or an expected hold beyond about 30 years is a mistake


def utc_text(epoch: float | None) -> str:
    """A store's epoch time as ISO 8601 in UTC, for people (logs, listings). Total: the store may hold a time
    no calendar has (a lease granted with a TTL of years beyond 9999, NaN), and what reads it is what an
    operator reads to clear it up."""
    if epoch is None:
        return "-"
    try:
        return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
    except (OverflowError, ValueError, OSError, TypeError):
        try:
            return f"{float(epoch):.6g} (epoch seconds, out of range)"
        except (OverflowError, ValueError, TypeError):
            return "(out of range)"


class LeaseRequestError(LeaseError, ValueError):
    """A lease request that cannot be stored or judged; the message names the field."""


@dataclass(frozen=True)
class LeaseRequest:
    """One task try asking to write to one table of a pool.

    ``owner`` identifies the task try (only it may renew or release the lease). ``pool``'s model,
    writer limit and TTL are copied in by the caller from the pool file, so a store needs no
    configuration of its own. The footprint is kept per partition (``compact``): a lease compares
    partitions, never files.

    ``expected_hold`` (seconds; ``None``: unknown) is how long a lease of this kind of job on this table
    was held lately (``pools.holding.WaitEstimate``). It lets the arbiter grant the request ahead of an
    earlier one it conflicts with when it is expected to end before that one can start (``arbiter``);
    like the summary, it is no part of what the job will do, so asking again with another estimate is no
    re-plan.
    """

    pool: str
    table: str
    owner: str
    footprint: Footprint
    table_state: TableState
    model: Model = "delta"
    max_writers: int | None = None
    ttl: float = 300.0
    summary: str = field(default="", compare=False)
    expected_hold: float | None = field(default=None, compare=False)

    @classmethod
    def of(cls, *, pool: str, table: str, owner: str, footprint: Footprint, table_state: TableState,
           model: Model = "delta", max_writers: int | None = None, ttl: float = 300.0,
           expected_hold: float | None = None) -> LeaseRequest:
        """A checked request; the audit summary is taken from the full footprint before it is compacted.

        Raises:
            LeaseRequestError: an empty or oversized name, an unknown model, a bad limit or TTL.
        """
        request = cls(pool=pool, table=table, owner=owner, footprint=compact(footprint), table_state=table_state,
                      model=model, max_writers=max_writers, ttl=ttl,
                      summary=summarize(footprint, table_state.version), expected_hold=expected_hold)
        request.check()
        return request

    def check(self) -> None:
        """Raises ``LeaseRequestError`` naming the first bad field."""
        for name, value, limit in (("pool", self.pool, 200), ("table", self.table, MAX_TABLE_LENGTH),
                                   ("owner", self.owner, MAX_OWNER_LENGTH)):
            if not isinstance(value, str) or not value.strip() or len(value) > limit:
                raise LeaseRequestError(f"{name} must be a non-empty string of at most {limit} characters, "
                                        f"got {_shown(value)}")
        if not isinstance(self.model, str) or self.model not in MODELS:
            raise LeaseRequestError(f"model must be one of {', '.join(MODELS)}, got {_shown(self.model)}")
        if self.max_writers is not None and (isinstance(self.max_writers, bool) or not isinstance(
                self.max_writers, int) or self.max_writers < 1):
            raise LeaseRequestError(f"max_writers must be a positive integer or null, got {_shown(self.max_writers)}")
        if not _seconds(self.ttl) or self.ttl <= 0:
            raise LeaseRequestError(f"ttl must be a positive number of seconds, got {_shown(self.ttl)}")
        if self.expected_hold is not None and (not _seconds(self.expected_hold) or self.expected_hold < 0):
            raise LeaseRequestError(f"expected_hold must be a number of seconds from 0 or null, got "
                                    f"{_shown(self.expected_hold)}")

    @property
    def planned(self) -> PlannedJob:
        return PlannedJob(self.footprint, self.table_state)

    @functools.cached_property
    def reach(self) -> Reach | None:
        """The partitions the job can touch (``compare.reach``), once per request; ``None`` when it cannot be
        worked out (then the request is compared with every other of its table, and the judge decides)."""
        try:
            return reach(self.planned, self.model)
        except Exception:   # an unreadable footprint is never filed as narrower than it is
            return None

    @functools.cached_property
    def json_text(self) -> str:
        """``to_json`` as compact, key-sorted text, computed once (stores write it, the audit quotes it)."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "table": self.table, "owner": self.owner, "footprint": self.footprint.to_json(),
                "table_state": self.table_state.to_json(), "model": self.model, "max_writers": self.max_writers,
                "ttl": self.ttl, "summary": self.summary, "expected_hold": self.expected_hold}

    @classmethod
    def from_json_text(cls, text: str) -> LeaseRequest:
        """``from_json`` of stored JSON text (a store's row, an audit detail); the text is untrusted.

        Raises:
            LeaseRequestError: not JSON, nested deeper than Python can decode, or not a request.
        """
        try:
            data = json.loads(text)
        except RecursionError as exc:
            raise LeaseRequestError("lease request: the JSON is nested too deeply to decode") from exc
        except ValueError as exc:   # json.JSONDecodeError, and a str that is not text
            raise LeaseRequestError(f"lease request is not JSON: {exc}") from exc
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: object) -> LeaseRequest:
        """Rebuild from ``to_json``'s form; the document is untrusted.

        Raises:
            LeaseRequestError: the document does not describe a request; the message names the field.
        """
        if not isinstance(data, dict):
            raise LeaseRequestError(f"a lease request must be an object, got {type(data).__name__}")
        try:
            footprint = Footprint.from_json(data.get("footprint"))
            state = TableState.from_json(data.get("table_state"))
        except FootprintDecodeError as exc:
            raise LeaseRequestError(f"lease request: {exc}") from exc
        except RecursionError as exc:  # the engine's decoders refuse depth; this is the last guard
            raise LeaseRequestError("lease request: the footprint is nested too deeply") from exc
        fields: dict[str, Any] = data  # each field is checked by check() below
        summary = fields.get("summary") or ""
        if not isinstance(summary, str):
            raise LeaseRequestError(f"lease request: summary must be a string, got {_shown(summary)}")
        request = cls(pool=fields.get("pool", ""), table=fields.get("table", ""), owner=fields.get("owner", ""),
                      footprint=footprint, table_state=state, model=fields.get("model", "delta"),
                      max_writers=fields.get("max_writers"), ttl=fields.get("ttl", 300.0), summary=summary,
                      expected_hold=fields.get("expected_hold"))
        request.check()
        return request


def summarize(fp: Footprint, version: int) -> str:
    """One line for the audit: what the job reads, rewrites and writes, at which version it was planned."""
    def partitions(values: Any) -> str:
        distinct = sorted({",".join(f"{k}={v}" for k, v in sorted(pv.items())) for pv in values})
        shown = "; ".join(p or "(unpartitioned)" for p in distinct[:3])
        return shown + (f" and {len(distinct) - 3} more" if len(distinct) > 3 else "")

    parts = [f"{fp.operation.value} '{fp.label}' planned at version {version}"]
    if fp.read_predicate is not None:
        parts.append("reads the whole table" if fp.read_whole_table
                     else f"reads {len(fp.read_files)} files in {partitions(fp.read_files.values()) or 'no partition'}")
    if fp.removes:
        parts.append(f"rewrites {len(fp.removes)} files")
    if fp.adds_files:
        parts.append("writes anywhere" if fp.write_partitions is None
                     else f"writes into {partitions(fp.write_partitions) or 'no partition'}")
    if fp.metadata is not None or fp.protocol is not None:
        parts.append("changes the table's metadata")
    return "; ".join(parts)


def _seconds(value: object) -> bool:
    """Whether ``value`` is a finite number of seconds (a JSON integer too large for a float is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and abs(value) <= MAX_SECONDS
    except OverflowError:
        return False


def operation_of(summary: str) -> str:
    """The operation a ``summarize`` line names (its first word: ``UPDATE``, ``OPTIMIZE``...); "" if none."""
    return summary.split(" ", 1)[0] if summary else ""


class LeaseStatus(StrEnum):
    WAITING = "waiting"
    GRANTED = "granted"
    GONE = "gone"          # released, expired, or never known: the caller holds nothing


@dataclass(frozen=True)
class LeaseRecord:
    """One live request as a store keeps it (waiting or granted). Times are the store's clock, epoch seconds."""

    request_id: str
    pool: str
    table: str
    owner: str
    seq: int                        # arrival order within the pool
    status: LeaseStatus
    summary: str
    requested_at: float
    granted_at: float | None
    expires_at: float

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "pool": self.pool, "table": self.table, "owner": self.owner,
                "seq": self.seq, "status": self.status.value, "summary": self.summary,
                "requested_at": self.requested_at, "granted_at": self.granted_at, "expires_at": self.expires_at}

    @classmethod
    def from_json(cls, data: object) -> LeaseRecord:
        """Raises ``LeaseRequestError`` when ``data`` is not ``to_json``'s form."""
        doc = _object(data, "lease record")
        try:
            return cls(request_id=str(doc["request_id"]), pool=str(doc["pool"]), table=str(doc["table"]),
                       owner=str(doc["owner"]), seq=int(doc["seq"]), status=LeaseStatus(doc["status"]),
                       summary=str(doc["summary"]), requested_at=float(doc["requested_at"]),
                       granted_at=None if doc["granted_at"] is None else float(doc["granted_at"]),
                       expires_at=float(doc["expires_at"]))
        except RecursionError as exc:   # str() of a value nested deeper than Python can print
            raise LeaseRequestError("lease record: a field is nested too deeply") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise LeaseRequestError(f"lease record: {exc!r}") from exc


@dataclass(frozen=True)
class Blocker:
    """Why a request waits: a lease or an earlier request it can conflict with, or the pool's writer limit."""

    reason: str
    request_id: str | None = None   # None: the writer limit
    owner: str | None = None
    granted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "request_id": self.request_id, "owner": self.owner, "granted": self.granted}

    @classmethod
    def from_json(cls, data: object) -> Blocker:
        doc = _object(data, "blocker")
        return cls(reason=str(doc.get("reason", "")), request_id=_optional_str(doc.get("request_id")),
                   owner=_optional_str(doc.get("owner")), granted=doc.get("granted") is True)


@dataclass(frozen=True)
class LeaseState:
    """The answer to ``acquire`` and ``poll``: granted, waiting (and on what), or gone."""

    request_id: str
    status: LeaseStatus
    checked_at: float
    record: LeaseRecord | None = None
    blockers: tuple[Blocker, ...] = ()

    @property
    def granted(self) -> bool:
        return self.status is LeaseStatus.GRANTED

    @property
    def waited(self) -> float | None:
        """Seconds from the request to the grant (or to now while waiting)."""
        if self.record is None:
            return None
        end = self.record.granted_at if self.record.granted_at is not None else self.checked_at
        return max(0.0, end - self.record.requested_at)

    def to_json(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "status": self.status.value, "checked_at": self.checked_at,
                "record": None if self.record is None else self.record.to_json(),
                "blockers": [b.to_json() for b in self.blockers]}

    @classmethod
    def from_json(cls, data: object) -> LeaseState:
        """Raises ``LeaseRequestError`` when ``data`` is not ``to_json``'s form (a trigger event carries it)."""
        doc = _object(data, "lease state")
        blockers = doc.get("blockers") or []
        if not isinstance(blockers, list):
            raise LeaseRequestError("lease state: blockers must be an array")
        try:
            return cls(request_id=str(doc["request_id"]), status=LeaseStatus(doc["status"]),
                       checked_at=float(doc["checked_at"]),
                       record=None if doc.get("record") is None else LeaseRecord.from_json(doc["record"]),
                       blockers=tuple(Blocker.from_json(b) for b in blockers))
        except RecursionError as exc:   # str() of a value nested deeper than Python can print
            raise LeaseRequestError("lease state: a field is nested too deeply") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise LeaseRequestError(f"lease state: {exc!r}") from exc


def _object(data: object, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise LeaseRequestError(f"a {what} must be an object, got {type(data).__name__}")
    return data


def _shown(value: object) -> str:
    """``value`` for an error message: a scalar's repr, cut short; a container by its type only (its repr
    could be huge, or nested deeper than Python can print)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 80:
        return "an integer of more than 80 digits"   # repr refuses ints above 4300 digits
    if value is None or isinstance(value, str | int | float):
        return f"{value!r:.80}"
    return f"a {type(value).__name__}"


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


class AuditKind(StrEnum):
    REQUEST = "request"
    REPLAN = "replan"      # a waiter replaced its footprint (the table moved); it keeps its place
    GRANT = "grant"
    RENEW = "renew"
    RELEASE = "release"
    CANCEL = "cancel"      # a waiter gave up
    EXPIRE = "expire"      # a holder missed its heartbeat: the lease is gone
    ABANDON = "abandon"    # a waiter stopped polling: its request is gone


@dataclass(frozen=True)
class AuditEvent:
    """One line of a pool's history."""

    at: float
    pool: str
    table: str
    request_id: str
    owner: str
    kind: AuditKind
    summary: str
    detail: str = ""
    event_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "at": self.at, "pool": self.pool, "table": self.table,
                "request_id": self.request_id, "owner": self.owner, "kind": self.kind.value,
                "summary": self.summary, "detail": self.detail}
