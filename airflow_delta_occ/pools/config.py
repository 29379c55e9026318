"""The conflict pool file: which Delta tables share a pool, and how writers to them are leased.

Platform teams write one TOML file (``[delta_occ] pool_file``)::

    [pools.sales]
    tables = ["s3://lake/sales/**", "main.sales.*"]
    model = "delta"            # delta | databricks | maxcompute: whose conflict rules the arbiter applies
    max_writers = 8            # leases held at once in the pool; omit for no limit
    lease_ttl = "10m"          # seconds, or a string with an s/m/h suffix
    heartbeat = "30s"
    airflow_pool = "delta_sales"   # default delta_occ_<name>
    description = "..."

Everything is checked when the file is loaded, so a typo fails once, naming the file and the entry,
instead of leaving a table silently outside its pool. Pure Python: the scheduler, the triggerer and
the CLI all read it, so it imports neither Airflow nor Spark nor pyarrow.

Tables and patterns are compared in one normal form (``normalize_table``) so that ``s3a://lake/t/``
written by a Spark job and ``s3://lake/t`` written by the platform team are the same table. A table
belongs to at most one pool: overlapping pools are refused at load time (see ``patterns_may_overlap``)
and, should the check miss a case, ``PoolConfig.pool_for`` refuses to choose.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from airflow_delta_occ.engine.errors import UnsupportedStorageError
from airflow_delta_occ.engine.object_store import URI_SCHEME, canonical_table
from airflow_delta_occ.exceptions import PoolConfigError

if TYPE_CHECKING:
    from airflow_delta_occ.engine.planner import Model

# The planner's ``MODELS``, repeated because importing the planner loads pyarrow (a test keeps them equal).
MODELS: tuple[Model, ...] = ("delta", "databricks", "maxcompute")
DEFAULT_LEASE_TTL = 300.0
DEFAULT_HEARTBEAT = 30.0
MIN_HEARTBEATS_PER_TTL = 3
# The ranges of the file's numbers (docs/pools.md). A heartbeat under 0.1 s hammers the store; over an
# hour, a dead holder is noticed too late. A TTL over 7 days keeps a dead worker's lease for a week; a
# number no clock can add (``90000000000h``) would fail only after the job committed, leaving the lease held.
HEARTBEAT_RANGE = (0.1, 3600.0)
LEASE_TTL_RANGE = (1.0, 7 * 86400.0)
MAX_WRITERS_RANGE = (1, 10_000)
AIRFLOW_POOL_PREFIX = "delta_occ_"
POOL_KEYS = ("tables", "model", "max_writers", "lease_ttl", "heartbeat", "airflow_pool", "description")

_AIRFLOW_POOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")  # stats-safe characters; Airflow's column is 256 wide
_POOL_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smh])\s*", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_NOT_IN_NAME_PART = frozenset(".`/:")

TableKind = Literal["location", "catalog"]


# --- table identifiers ----------------------------------------------------------------------------

def normalize_table(table: str) -> str:
    """The one spelling of a table location or catalog name that patterns are matched against.

    This is the lease key: one physical table must have one, or two conflicting writers spelling it
    differently would both be granted. Locations (paths and URIs): ``engine.object_store.canonical_table``,
    the spelling OpenLineage's dataset names use too (the scheme lower-cased and one per store; host,
    bucket, account and container lower-cased; default ports left off, HDFS's written out; doubled and
    trailing slashes removed; the path's case kept; a local path or ``file:`` URI as
    ``file:///abs/path``, resolved lexically: the filesystem is never read). Catalog names: backticks
    around parts removed, lower-cased (Spark catalogs ignore case). Patterns go through the same
    function, so wildcards are kept as written.

    Raises:
        ValueError: empty, a relative path (whose meaning depends on the writer's working directory),
            a ``file:`` URI on another host, a URI ``canonical_table`` refuses (user info, a bad
            port, ``#``, ``%``, ``.`` segments), or a name part that is empty or holds ``.``, a
            backtick, ``/``, ``:`` or whitespace.
    """
    if not isinstance(table, str):
        raise ValueError(f"expected a table path, URI or catalog name, got {table!r}")
    text = table.strip()
    if not text:
        raise ValueError("empty table identifier")
    if text.startswith("`"):
        return _normalize_name(text)
    if URI_SCHEME.fullmatch(text) is not None or "/" in text:
        try:
            return canonical_table(text)
        except UnsupportedStorageError as exc:
            raise ValueError(str(exc)) from exc
    return _normalize_name(text)


def table_kind(normalized: str) -> TableKind:
    """``location`` or ``catalog`` for a normalized identifier (locations always carry ``://``)."""
    return "location" if "://" in normalized else "catalog"


def _normalize_name(text: str) -> str:
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == "`":
            end = text.find("`", i + 1)
            if end < 0:
                raise ValueError(f"{text!r}: unclosed backtick")
            part, i = text[i + 1:end], end + 1
            if i < n and text[i] != ".":
                raise ValueError(f"{text!r}: expected '.' after `{part}`")
        else:
            end = text.find(".", i)
            end = n if end < 0 else end
            part, i = text[i:end], end
        if not part or any(c.isspace() or c in _NOT_IN_NAME_PART for c in part):
            raise ValueError(f"{text!r}: name part {part!r} must be non-empty, without '.', backticks, '/', ':' "
                             f"or spaces")
        parts.append(part.lower())
        if i >= n:
            return ".".join(parts)
        i += 1  # the '.'; a trailing one leaves an empty last part, refused above


# --- patterns -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Compiled:
    """A normalized pattern as a regex, with what the overlap check needs to know about it."""

    kind: TableKind
    regex: re.Pattern[str]
    literal: bool  # no wildcard: the pattern names exactly one table
    prefix: str  # literal text before the first wildcard: every match starts with it
    suffix: str  # literal text after the last wildcard: every match ends with it
    depth: int | None  # separators in every match; None when ``**`` makes it vary


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> _Compiled:
    """Translate ``fnmatchcase`` syntax, with ``*``, ``?`` and ``[...]`` stopping at the separator.

    The separator is ``/`` for locations and ``.`` for catalog names. ``**`` matches anything, and
    ``**`` between two separators (or at the start, before one) also matches zero parts, so
    ``s3://lake/**/orders`` matches ``s3://lake/orders``.
    """
    kind = table_kind(pattern)
    sep = "/" if kind == "location" else "."
    not_sep = f"[^{re.escape(sep)}]"
    out: list[str] = []
    chars: list[str | None] = []  # the pattern's literal characters, None for each wildcard
    starstar = False
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            j = i
            while j < n and pattern[j] == "*":
                j += 1
            if j - i == 1:
                out.append(not_sep + "*")
            elif (i == 0 or pattern[i - 1] == sep) and j < n and pattern[j] == sep:
                out.append(f"(?:.*{re.escape(sep)})?")
                j += 1
                starstar = True
            else:
                out.append(".*")
                starstar = True
            chars.append(None)
            i = j
        elif c == "?":
            out.append(not_sep)
            chars.append(None)
            i += 1
        elif c == "[" and (klass := _char_class(pattern, i)) is not None:
            out.append(f"(?!{re.escape(sep)}){klass[0]}")
            chars.append(None)
            i = klass[1]
        else:
            out.append(re.escape(c))
            chars.append(c)
            i += 1
    try:
        regex = re.compile("".join(out), re.DOTALL)
    except re.error as exc:
        raise ValueError(f"{pattern!r}: invalid character class ({exc})") from exc
    wild = [k for k, c in enumerate(chars) if c is None]
    literal_text = "".join(c for c in chars if c is not None)
    if not wild:
        return _Compiled(kind, regex, True, literal_text, literal_text, literal_text.count(sep))
    prefix = "".join(c for c in chars[:wild[0]] if c is not None)
    suffix = "".join(c for c in chars[wild[-1] + 1:] if c is not None)
    return _Compiled(kind, regex, False, prefix, suffix, None if starstar else literal_text.count(sep))


def _char_class(pattern: str, start: int) -> tuple[str, int] | None:
    """``[...]`` / ``[!...]`` at ``start`` as a regex class and the index after it; None if unclosed."""
    j = start + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    j = pattern.find("]", j)
    if j < 0:
        return None
    body = pattern[start + 1:j]
    negate = body.startswith("!")
    body = re.sub(r"([\\\[\]^&~|])", r"\\\1", body[1:] if negate else body)
    return f"[{'^' if negate else ''}{body}]", j + 1


def matches(pattern: str, table: str) -> bool:
    """Whether ``table`` matches ``pattern``, both normalized first; a location never matches a name.

    Raises:
        ValueError: either one cannot be normalized (see ``normalize_table``).
    """
    return _matches(normalize_table(pattern), normalize_table(table))


def _matches(pattern: str, table: str) -> bool:
    compiled = _compile(pattern)
    return compiled.kind == table_kind(table) and compiled.regex.fullmatch(table) is not None


def patterns_may_overlap(a: str, b: str) -> bool:
    """Whether some table could match both normalized patterns; conservative (never a false "no").

    * a location pattern and a catalog pattern never overlap;
    * identical patterns overlap;
    * a literal pattern (no wildcard) overlaps exactly when the other pattern matches it;
    * two wildcard patterns overlap unless one of these proves they cannot:
      their literal prefixes (text before the first wildcard) diverge - neither starts with the
      other; their literal suffixes (after the last wildcard) diverge - neither ends with the
      other; or neither uses ``**`` and they have different numbers of separators (``*``, ``?``
      and ``[...]`` never match one, so the count is fixed).

    The approximation refuses some disjoint pairs, e.g. ``s3://l/t/*`` with ``s3://l/t/*/x/**``
    (same prefix, ``**`` hides the depth); give such pools distinct literal prefixes.
    """
    pa, pb = _compile(a), _compile(b)
    if pa.kind != pb.kind:
        return False
    if a == b:
        return True
    if pa.literal:
        return pb.regex.fullmatch(a) is not None
    if pb.literal:
        return pa.regex.fullmatch(b) is not None
    if not (pa.prefix.startswith(pb.prefix) or pb.prefix.startswith(pa.prefix)):
        return False
    if not (pa.suffix.endswith(pb.suffix) or pb.suffix.endswith(pa.suffix)):
        return False
    return pa.depth is None or pb.depth is None or pa.depth == pb.depth


# --- durations ------------------------------------------------------------------------------------

def parse_duration(value: object, bounds: tuple[float, float] | None = None) -> float:
    """Seconds from a positive number or a string such as ``"30s"``, ``"10m"``, ``"1.5h"``, within ``bounds``
    (inclusive) when given.

    A bare string number is refused: ``"10"`` in a file is more often a forgotten unit than seconds.
    Bounds keep a number the clock cannot add (``"90000000000h"``) from being accepted here and failing
    later, after a job committed, with its lease still held.

    Raises:
        ValueError: anything else (booleans, zero, negative, infinite, other units), or a value
            outside ``bounds`` (the message gives the range).
    """
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an integer past any float
            seconds = math.inf if bounds is not None and value > 0 else None
    elif isinstance(value, str) and (m := _DURATION.fullmatch(value)):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
    if seconds is None or seconds <= 0 or (not math.isfinite(seconds) and isinstance(value, float | str)):
        raise ValueError("expected seconds as a positive number or a string like '30s', '10m', '1h', got "
                         f"{_shown(value)}")
    if bounds is not None and not bounds[0] <= seconds <= bounds[1]:
        shown = _seconds_text(seconds) if math.isfinite(seconds) else _shown(value)
        raise ValueError(f"{shown} is outside {duration_range_text(bounds)}")
    return seconds


def duration_range_text(bounds: tuple[float, float]) -> str:
    """``1s .. 604800s (7 days)``: a range of seconds as the messages and docs give it."""
    low, high = bounds
    return f"{_seconds_text(low)} .. {_seconds_text(high)}" + (f" ({human})" if (human := _human(high)) else "")


def _human(seconds: float) -> str | None:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return None


def _seconds_text(seconds: float) -> str:
    return f"{seconds:g}s"


def _label(name: object) -> str:
    """A pool's name as the ``pools.<name>`` of a message: as written, unless it is too long or no string."""
    return name if isinstance(name, str) and len(name) <= _REPR.maxstring else _shown(name)


_REPR = reprlib.Repr()
_REPR.maxlevel = 3
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def _shown(value: object) -> str:
    """A value of the file in a message: short, and total. A value nested thousands deep, or an integer
    of thousands of digits, makes ``repr`` raise (RecursionError, ValueError); a 1 MB string would
    flood the scheduler's log."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 64:
        exponent = int(math.log10(abs(value)))
        return f"{'-' if value < 0 else ''}{abs(value) / 10 ** exponent:.3g}e+{exponent}"
    try:
        return _REPR.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


# --- pools ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pool:
    """One conflict pool: the tables it covers and how its writers are leased.

    Checked on construction (from the file or from code), so a ``Pool`` is always usable. ``tables``
    are stored normalized; durations may be given as strings (``"10m"``) and are stored in seconds;
    an empty ``airflow_pool`` becomes ``delta_occ_<name>``.

    Raises:
        PoolConfigError: a field is unusable; the message starts with ``pools.<name>.<field>``.
    """

    name: str
    tables: tuple[str, ...]
    model: Model = "delta"
    max_writers: int | None = None  # None: no limit; the arbiter still keeps conflicting writers apart
    lease_ttl: float = DEFAULT_LEASE_TTL  # a lease not renewed for this long is free again (a dead worker)
    heartbeat: float = DEFAULT_HEARTBEAT  # how often a holder renews its lease
    airflow_pool: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _POOL_NAME.fullmatch(self.name):
            raise PoolConfigError(f"pools.{_label(self.name)}: invalid pool name {_shown(self.name)}; use letters, "
                                  "digits, _, - and .")
        where = f"pools.{self.name}"
        object.__setattr__(self, "tables", self._normalized_tables(where))
        if self.model not in MODELS:
            raise PoolConfigError(f"{where}.model: expected one of {', '.join(MODELS)}, got {_shown(self.model)}")
        self._check_max_writers(where)
        for field_name, bounds in (("lease_ttl", LEASE_TTL_RANGE), ("heartbeat", HEARTBEAT_RANGE)):
            try:
                object.__setattr__(self, field_name, parse_duration(getattr(self, field_name), bounds))
            except ValueError as exc:
                raise PoolConfigError(f"{where}.{field_name}: {exc}") from exc
        if self.lease_ttl < MIN_HEARTBEATS_PER_TTL * self.heartbeat:
            raise PoolConfigError(
                f"{where}.lease_ttl: {_seconds_text(self.lease_ttl)} is less than {MIN_HEARTBEATS_PER_TTL} times "
                f"heartbeat ({_seconds_text(self.heartbeat)}); a lease must outlive two missed heartbeats")
        for field_name in ("airflow_pool", "description"):
            if not isinstance(getattr(self, field_name), str):
                raise PoolConfigError(f"{where}.{field_name}: expected a string, got "
                                      f"{_shown(getattr(self, field_name))}")
        if not self.airflow_pool:
            object.__setattr__(self, "airflow_pool", AIRFLOW_POOL_PREFIX + self.name)
        if not _AIRFLOW_POOL_NAME.fullmatch(self.airflow_pool):
            raise PoolConfigError(f"{where}.airflow_pool: {_shown(self.airflow_pool)} is not a valid Airflow pool "
                                  "name; use up to 256 letters, digits, _, - and .")

    def _check_max_writers(self, where: str) -> None:
        writers = self.max_writers
        if writers is None:
            return
        if not isinstance(writers, int) or isinstance(writers, bool) or writers < 1:
            raise PoolConfigError(f"{where}.max_writers: expected a positive integer, got {_shown(writers)}")
        low, high = MAX_WRITERS_RANGE
        if writers > high:
            raise PoolConfigError(f"{where}.max_writers: {_shown(writers)} is outside {low} .. {high}; omit it for "
                                  "no limit")

    def _normalized_tables(self, where: str) -> tuple[str, ...]:
        if not isinstance(self.tables, tuple | list):
            raise PoolConfigError(f"{where}.tables: expected an array of strings, got {_shown(self.tables)}")
        if not self.tables:
            raise PoolConfigError(f"{where}.tables: expected at least one table pattern")
        normalized = []
        for index, pattern in enumerate(self.tables):
            if not isinstance(pattern, str):
                raise PoolConfigError(f"{where}.tables[{index}]: expected a string, got {_shown(pattern)}")
            try:
                normalized.append(normalize_table(pattern))
                _compile(normalized[-1])
            except ValueError as exc:
                raise PoolConfigError(f"{where}.tables[{index}]: {exc}") from exc
        return tuple(normalized)

    def matching_pattern(self, table: str) -> str | None:
        """The first of this pool's patterns that the *normalized* ``table`` matches, or None."""
        return next((p for p in self.tables if _matches(p, table)), None)

    def to_json(self) -> dict[str, Any]:
        """The pool as plain JSON values (display, CLI); ``Pool(**...)`` with tables as a tuple rebuilds it."""
        return {"name": self.name, "tables": list(self.tables), "model": self.model,
                "max_writers": self.max_writers, "lease_ttl": self.lease_ttl, "heartbeat": self.heartbeat,
                "airflow_pool": self.airflow_pool, "description": self.description}


@dataclass(frozen=True)
class PoolConfig:
    """Every pool of one file; ``source`` (the file's path) prefixes every error message.

    Construction refuses duplicate pool names, two pools sharing an Airflow pool, and two pools
    that could both match a table (``patterns_may_overlap``).

    Raises:
        PoolConfigError: naming the source and the entries in conflict.
    """

    pools: tuple[Pool, ...]
    source: str

    def __post_init__(self) -> None:
        names: dict[str, Pool] = {}
        airflow_pools: dict[str, Pool] = {}
        for pool in self.pools:
            if pool.name in names:
                raise PoolConfigError(f"{self.source}: duplicate pool name {pool.name!r}")
            owner = airflow_pools.get(pool.airflow_pool)
            if owner is not None:
                raise PoolConfigError(f"{self.source}: pools.{pool.name}.airflow_pool: {pool.airflow_pool!r} is "
                                      f"already the Airflow pool of pools.{owner.name}")
            for earlier in names.values():
                self._check_disjoint(earlier, pool)
            names[pool.name] = pool
            airflow_pools[pool.airflow_pool] = pool

    def _check_disjoint(self, earlier: Pool, pool: Pool) -> None:
        for index, pattern in enumerate(pool.tables):
            for other_index, other in enumerate(earlier.tables):
                if patterns_may_overlap(other, pattern):
                    raise PoolConfigError(
                        f"{self.source}: pools.{pool.name}.tables[{index}]: {pattern!r} could also match "
                        f"pools.{earlier.name}.tables[{other_index}] ({other!r}); a table must belong to at most "
                        "one pool, so give the pools disjoint patterns (distinct literal prefixes)")

    def get(self, name: str) -> Pool:
        """The pool called ``name``.

        Raises:
            PoolConfigError: no such pool (the message lists the known ones).
        """
        for pool in self.pools:
            if pool.name == name:
                return pool
        known = ", ".join(sorted(p.name for p in self.pools)) or "(none)"
        raise PoolConfigError(f"{self.source}: unknown pool {name!r}; known pools: {known}")

    def pool_for(self, table: str) -> Pool | None:
        """The pool whose patterns match ``table`` (a path, URI or catalog name), or None.

        Raises:
            PoolConfigError: more than one pool matches (a case the load-time check missed): choosing
                one would let writers leased in different pools conflict.
            ValueError: ``table`` cannot be normalized (see ``normalize_table``).
        """
        normalized = normalize_table(table)
        found = [(pool, pattern) for pool in self.pools
                 if (pattern := pool.matching_pattern(normalized)) is not None]
        if len(found) > 1:
            named = [f"{pool.name} ({pattern!r})" for pool, pattern in found]
            raise PoolConfigError(f"{self.source}: table {normalized!r} matches pools {', '.join(named[:-1])} and "
                                  f"{named[-1]}; a table must belong to at most one pool")
        return found[0][0] if found else None

    def to_json(self) -> dict[str, Any]:
        """The configuration as plain JSON values: ``{"source": ..., "pools": [pool, ...]}``."""
        return {"source": self.source, "pools": [pool.to_json() for pool in self.pools]}


# --- the file -------------------------------------------------------------------------------------

def load_pool_config(path: str | os.PathLike[str]) -> PoolConfig:
    """Read and check the pool file at ``path`` (format in the module docstring).

    Raises:
        PoolConfigError: the file cannot be read or parsed, or an entry is unusable; the message
            starts with the path and names the entry (``pools.sales.max_writers: ...``).
    """
    source = os.fspath(path)
    try:
        with open(source, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise PoolConfigError(f"{source}: cannot be read: {exc.strerror or exc}") from exc
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, an integer of over 4,300 digits
        raise PoolConfigError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError:  # the parser recurses once per level of nesting
        raise PoolConfigError(f"{source}: not valid TOML: arrays or tables nested too deeply") from None
    unknown = sorted(set(data) - {"pools"})
    if unknown:
        raise PoolConfigError(f"{source}: unknown top-level key {_shown(unknown[0])}; allowed: pools")
    entries = data.get("pools", {})
    if not isinstance(entries, dict):
        raise PoolConfigError(f"{source}: pools: expected a table ([pools.<name>] sections), got {_shown(entries)}")
    try:
        pools = tuple(_pool(name, entry) for name, entry in entries.items())
        return PoolConfig(pools, source)
    except RecursionError:  # a safety net: every check above is meant to stay shallow
        raise PoolConfigError(f"{source}: a value is nested too deeply to check") from None
    except PoolConfigError as exc:
        if str(exc).startswith(f"{source}: "):
            raise
        raise PoolConfigError(f"{source}: {exc}") from exc


def _pool(name: str, entry: object) -> Pool:
    label = _label(name)
    if not isinstance(entry, dict):
        raise PoolConfigError(f"pools.{label}: expected a table ([pools.{label}] section), got {_shown(entry)}")
    unknown = sorted(set(entry) - set(POOL_KEYS))
    if unknown:
        raise PoolConfigError(f"pools.{label}: unknown key {_shown(unknown[0])}; allowed: {', '.join(POOL_KEYS)}")
    if "tables" not in entry:
        raise PoolConfigError(f"pools.{label}.tables: missing; list the table patterns of the pool")
    tables = entry["tables"]
    fields = {**entry, "tables": tuple(tables) if isinstance(tables, list) else tables}
    return Pool(name, **fields)
