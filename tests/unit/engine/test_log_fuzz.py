"""A malformed log gives a typed error naming the file, never a raw Python or pyarrow error.

The concrete cases pin one corruption each (wrong JSON type, out-of-range number, absurd nesting,
wrong Parquet column type); the fuzz tests mutate valid commits and checkpoints at random and
exercise the whole read API on the result: every outcome must be success or a ``DeltaOccError``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_delta_occ.engine import DeltaLog, DeltaOccError, LogCorruptError
from airflow_delta_occ.engine.conflicts import WinningCommit
from airflow_delta_occ.engine.stats import parse_file_stats

from .logbuilder import SCHEMA, LogBuilder, add, commit_info, domain, dv, metadata, protocol, remove, txn

pytestmark = pytest.mark.unit

COMMIT1 = f"{1:020d}.json"
DE = {"date": "2024-01-01", "country": "DE"}
FR = {"date": "2024-01-02", "country": "FR"}
STATS = {"numRecords": 3, "minValues": {"id": 1, "name": "a"}, "maxValues": {"id": 9, "name": "z"},
         "nullCount": {"id": 0, "name": 1}}
PREDICATES = ("country = 'DE'", "id > 3", "date >= '2024-01-02' AND id < 10", "name = 'x' OR country = 'FR'")


# -- exercising a log ------------------------------------------------------------------------------

def _commit_info_fields(info: Any) -> None:
    if info is None:
        return
    for name in ("timestamp", "in_commit_timestamp", "operation", "operation_parameters", "operation_metrics",
                 "read_version", "isolation_level", "is_blind_append", "user_metadata", "txn_id", "tags"):
        getattr(info, name)


def _exercise(log: DeltaLog, *, tolerate: bool) -> None:
    """Everything a caller can ask of a log. With ``tolerate``, each step may fail with a typed error."""

    def run(step: Callable[[], Any]) -> Any:
        if not tolerate:
            return step()
        try:
            return step()
        except LogCorruptError as exc:
            assert exc.path is not None, f"LogCorruptError without a file: {exc}"
            return None
        except DeltaOccError:
            return None

    def history() -> None:
        for commit in log.history():
            _ = commit.timestamp
            _commit_info_fields(commit.commit_info)
            winner = WinningCommit.of(commit)
            _ = winner.is_blind_append, winner.identity_only_metadata_update

    run(history)
    run(lambda: log.commits_after(0))
    snap = run(log.snapshot)
    if snap is None:
        return
    run(lambda: repr(snap))
    run(lambda: snap.schema.simple_string())
    run(lambda: (snap.partition_columns, dict(snap.table_properties), snap.isolation_level,
                 snap.deletion_vectors_enabled, snap.row_tracking_enabled, snap.metadata.column_mapping_mode))
    run(lambda: (snap.reader_features, snap.writer_features, snap.protocol.supports("deletionVectors")))
    run(lambda: (snap.num_files, snap.file_paths()))
    run(lambda: [(f.key, snap.partition_values(f)) for f in snap.files()])
    run(lambda: [parse_file_stats(f.stats, snap.schema) for f in snap.files()])
    for predicate in PREDICATES:
        run(lambda p=predicate: snap.files_matching(p))
    run(lambda: (snap.app_transaction_version("app"), dict(snap.domain_metadata)))
    run(lambda: (_commit_info_fields(snap.commit_info), snap.timestamp))
    run(snap.update)
    for version in range(snap.version):
        run(lambda v=version: log.snapshot(v).file_paths())


def _raises_corrupt(root: str) -> LogCorruptError:
    with pytest.raises(LogCorruptError) as err:
        _exercise(DeltaLog.for_table(root), tolerate=False)
    return err.value


# -- concrete JSON corruptions ---------------------------------------------------------------------

@pytest.fixture
def table(tmp_path) -> LogBuilder:
    b = LogBuilder(tmp_path / "t")
    b.commit(commit_info("CREATE TABLE"), protocol(3, 7, ["deletionVectors"], ["deletionVectors"]),
             metadata(configuration={"delta.enableDeletionVectors": "true"}))
    return b


def _write(b: LogBuilder, version: int, *lines: str) -> str:
    path = os.path.join(b.log_dir, f"{version:020d}.json")
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def _line(kind: str, body: dict[str, Any], **raw: str) -> str:
    """One action line; a value ``"@name@"`` is replaced by the raw JSON text ``raw[name]``."""
    text = json.dumps({kind: body})
    for name, value in raw.items():
        text = text.replace(f'"@{name}@"', value)
    return text


def _add(**fields: Any) -> dict[str, Any]:
    body = add("date=2024-01-01/country=DE/a.parquet", DE, stats=STATS)["add"]
    body.update(fields)
    return body


def _meta(**fields: Any) -> dict[str, Any]:
    body = metadata(configuration={"delta.enableDeletionVectors": "true"})["metaData"]
    body.update(fields)
    return body


def _proto(**fields: Any) -> dict[str, Any]:
    body = protocol(3, 7, ["deletionVectors"], ["deletionVectors"])["protocol"]
    body.update(fields)
    return body


NESTED = "[" * 100_000 + "]" * 100_000
BIG = str(2**70)
BAD_DVS = [5, {}, dv("x") | {"sizeInBytes": "40"}, dv("x") | {"offset": -1}, dv("x") | {"storageType": 7},
           dv("x") | {"cardinality": 1.5}]

JSON_CASES: dict[str, str] = {
    "line is an array": "[1, 2]",
    "line is a number": "42",
    "line is a string": '"add"',
    "line nested 100000 deep": NESTED,
    "action nested 100000 deep": '{"add": ' + NESTED + "}",
    "add is a number": '{"add": 5}',
    "metaData is an array": '{"metaData": []}',
    "commitInfo is a number": '{"commitInfo": 5}',
    "protocol is a string": '{"protocol": "1"}',
    "txn is an array": '{"txn": [1]}',
    "path is a number": _line("add", _add(path=5)),
    "path is null": _line("add", _add(path=None)),
    "path has a lone surrogate": _line("add", _add(path="@p@"), p='"a\\ud800.parquet"'),
    "dataChange is a string": _line("add", _add(dataChange="false")),
    "partitionValues is a list": _line("add", _add(partitionValues=["2024-01-01", "DE"])),
    "partition value is a number": _line("add", _add(partitionValues={"date": 5, "country": "DE"})),
    "partition value is an object": _line("add", _add(partitionValues={"date": {"a": 1}, "country": "DE"})),
    "stats is a number": _line("add", _add(stats=5)),
    "stats is an object": _line("add", _add(stats=STATS)),
    "tags is a list": _line("add", _add(tags=["a"])),
    "huge integer literal": _line("add", _add(size="@n@"), n="9" * 5000),
    "cdc size is a string": _line("cdc", {"path": "c.parquet", "partitionValues": {}, "size": "5"}),
    "remove deletionTimestamp is a string": _line("remove", remove("a.parquet")["remove"] | {"deletionTimestamp": "x"}),
    "remove path is missing": _line("remove", {"deletionTimestamp": 1}),
    "configuration is a list": _line("metaData", _meta(configuration=[])),
    "configuration is a string": _line("metaData", _meta(configuration="x")),
    "configuration value is a bool": _line("metaData", _meta(configuration={"delta.enableDeletionVectors": True})),
    "configuration value is a number": _line("metaData", _meta(configuration={"k": 5})),
    "configuration value is null": _line("metaData", _meta(configuration={"delta.isolationLevel": None})),
    "partitionColumns is a string": _line("metaData", _meta(partitionColumns="date")),
    "partitionColumns holds a number": _line("metaData", _meta(partitionColumns=[1])),
    "schemaString is a number": _line("metaData", _meta(schemaString=5)),
    "metaData id is null": _line("metaData", _meta(id=None)),
    "format is a string": _line("metaData", _meta(format="parquet")),
    "format provider is a number": _line("metaData", _meta(format={"provider": 5})),
    "createdTime is a string": _line("metaData", _meta(createdTime="x")),
    "readerFeatures is a string": _line("protocol", _proto(readerFeatures="deletionVectors")),
    "writerFeatures holds numbers": _line("protocol", _proto(writerFeatures=[1])),
    "txn appId is a number": _line("txn", {"appId": 5, "version": 1}),
    "domain removed is a string": _line("domainMetadata", {"domain": "d", "configuration": "{}", "removed": "no"}),
    "domain configuration is an object": _line("domainMetadata", {"domain": "d", "configuration": {}}),
    "commitInfo timestamp is a string": _line("commitInfo", {"timestamp": "x"}),
    "commitInfo inCommitTimestamp is 1e400": _line("commitInfo", {"inCommitTimestamp": "@n@"}, n="1e400"),
    "commitInfo operation is a number": _line("commitInfo", {"operation": 5}),
    "commitInfo isBlindAppend is a string": _line("commitInfo", {"isBlindAppend": "yes"}),
    "commitInfo operationParameters is a list": _line("commitInfo", {"operationParameters": []}),
    "commitInfo readVersion is negative": _line("commitInfo", {"readVersion": -1}),
    "commitInfo tags value is a number": _line("commitInfo", {"tags": {"a": 1}}),
    "sidecar path is a number": _line("sidecar", {"path": 5, "sizeInBytes": 1}),
    "sidecar path holds a NUL": _line("sidecar", {"path": "a\x00b.parquet", "sizeInBytes": 1}),
    "checkpointMetadata version is a string": _line("checkpointMetadata", {"version": "1"}),
}
for _field in ("size", "modificationTime"):
    for _name, _raw in {"1e400": "1e400", "-1": "-1", "2**70": BIG, "a string": '"100"', "a bool": "true",
                        "a fraction": "1.5", "NaN": "NaN"}.items():
        JSON_CASES[f"{_field} is {_name}"] = _line("add", _add(**{_field: "@n@"}), n=_raw)
for _name, _raw in {"a string": '"1"', "a fraction": "1.5", "a bool": "true", "null": "null", "-1": "-1",
                    "2**70": BIG}.items():
    JSON_CASES[f"minReaderVersion is {_name}"] = _line("protocol", _proto(minReaderVersion="@n@"), n=_raw)
    JSON_CASES[f"minWriterVersion is {_name}"] = _line("protocol", _proto(minWriterVersion="@n@"), n=_raw)
for _name, _raw in {"a string": '"3"', "a bool": "true", "a fraction": "1.5", "null": "null", "-1": "-1",
                    "1e400": "1e400", "2**70": BIG}.items():
    JSON_CASES[f"txn version is {_name}"] = _line("txn", {"appId": "app", "version": "@n@"}, n=_raw)
for _i, _dv in enumerate(BAD_DVS):
    JSON_CASES[f"deletionVector malformed #{_i}"] = _line("add", _add(deletionVector=_dv))


@pytest.mark.parametrize("bad_line", list(JSON_CASES.values()), ids=list(JSON_CASES))
def test_malformed_json_line_is_log_corrupt_naming_file_and_line(table, bad_line):
    path = _write(table, 1, json.dumps(commit_info()), bad_line)
    err = _raises_corrupt(table.root)
    assert err.path == path and err.line == 2, err
    assert f"{COMMIT1}, line 2" in str(err)


def _deep_type(depth: int) -> dict[str, Any]:
    inner: Any = "long"
    for _ in range(depth):
        inner = {"type": "array", "elementType": inner, "containsNull": True}
    return {"type": "struct", "fields": [*SCHEMA["fields"], {"name": "deep", "type": inner, "nullable": True,
                                                              "metadata": {}}]}


@pytest.mark.parametrize("schema_string", [
    '{"type":"struct","fields":[{"name":"x","type":' + '{"type":"array","elementType":' * 100_000 + '"long"'
    + "}" * 100_000 + "}]}",
    json.dumps(_deep_type(900)),
    json.dumps(_deep_type(150)),
    json.dumps({"type": "struct", "fields": [{"name": "d", "type": "decimal(1000,2000)"}]}),
    json.dumps({"type": "struct", "fields": [{"name": "d", "type": "long", "nullable": "no"}]}),
    json.dumps({"type": "struct", "fields": [{"name": "d", "type": {"type": "array", "elementType": "long",
                                                                     "containsNull": 1}}]}),
    "[" * 100_000 + "]" * 100_000,
], ids=["100000 levels", "900 levels", "150 levels", "decimal precision", "nullable string", "containsNull int",
        "nested arrays"])
def test_malformed_schema_string_names_the_metadata_line(table, schema_string):
    path = _write(table, 1, json.dumps(commit_info()),
                  json.dumps({"metaData": _meta(schemaString=schema_string, partitionColumns=[])}))
    err = _raises_corrupt(table.root)
    assert err.path == path and err.line == 2, err


def test_partition_column_missing_from_schema_names_the_metadata_line(table):
    path = _write(table, 1, json.dumps(commit_info()), json.dumps({"metaData": _meta(partitionColumns=["nope"])}),
                  json.dumps(add("a.parquet", {"nope": "1"})))
    err = _raises_corrupt(table.root)
    assert err.path == path and err.line == 2, err


def test_lone_surrogate_path_after_a_checkpoint(table):
    table.commit(commit_info(), add("date=2024-01-01/country=DE/a.parquet", DE))
    table.checkpoint(1)
    path = _write(table, 2, json.dumps(commit_info()), _line("remove", {"path": "@p@"}, p='"\\udc80"'))
    err = _raises_corrupt(table.root)
    assert err.path == path and err.line == 2, err


@pytest.mark.parametrize("top_level", ["json", "parquet"])
def test_nul_in_a_v2_checkpoint_sidecar_path_names_the_checkpoint(table, top_level):
    """No store can hold a file name with a NUL: the checkpoint is corrupt, not a ``ValueError`` from ``open``."""
    table.commit(commit_info(), add("date=2024-01-01/country=DE/a.parquet", DE))
    name, (sidecar,) = table.v2_checkpoint(1, sidecars=1, top_level=top_level)
    path = os.path.join(table.log_dir, name)
    if top_level == "json":
        with open(path) as fh:
            text = fh.read()
        with open(path, "w") as fh:
            fh.write(text.replace(sidecar, "a\\u0000b.parquet"))
    else:
        pq.write_table(_mutate_column(pq.read_table(path), "sidecar", ("path",), _const("a\x00b.parquet")), path)
    err = _raises_corrupt(table.root)
    assert err.path == path and "NUL" in str(err), err


STATS_SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}},
    {"name": "score", "type": "double", "nullable": True, "metadata": {}},
    {"name": "country", "type": "string", "nullable": True, "metadata": {}},
]}


@pytest.mark.parametrize(("stats", "predicate"), [
    ('{"numRecords": 1, "maxValues": {"ts": "9999-12-31T23:59:59.999999Z"}}', "ts > '2024-01-01'"),
    ('{"numRecords": 1, "minValues": {"ts": "0001-01-01T00:00:00+01:00"}}', "ts > '2024-01-01'"),
    ('{"numRecords": 1, "minValues": {"score": NaN}, "maxValues": {"score": NaN}}', "score > 1"),
    ('{"numRecords": 1, "minValues": {"score": "NaN"}, "maxValues": {"score": "NaN"}}', "score > 1"),
    ('{"numRecords": 1, "minValues": {"id": 1e400}, "maxValues": {"id": -1e400}}', "id = 3"),
    ("[" * 100_000 + "]" * 100_000, "id = 3"),
    ('{"numRecords": true, "nullCount": {"id": true}}', "id IS NULL"),
], ids=["max timestamp", "min timestamp before epoch", "NaN literal", "NaN string", "infinite ints", "deep", "bools"])
def test_odd_stats_are_unknown_and_never_prune(tmp_path, stats, predicate):
    b = LogBuilder(tmp_path / "s")
    b.commit(commit_info(), protocol(), metadata(partition_columns=["country"], schema=STATS_SCHEMA))
    body = add("country=DE/a.parquet", {"country": "DE"})["add"] | {"stats": stats}
    b.commit(commit_info(), {"add": body})
    snap = DeltaLog.for_table(b.root).snapshot()
    assert [f.path for f in snap.files_matching(predicate)] == ["country=DE/a.parquet"]


def test_absurd_commit_version_in_a_file_name_does_not_hang(table):
    open(os.path.join(table.log_dir, "9" * 20 + ".json"), "w").close()
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            DeltaLog.for_table(table.root).snapshot()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(10)
    assert outcome, "snapshot() did not return within 10 s"
    assert isinstance(outcome[0], LogCorruptError), outcome[0]


# -- concrete checkpoint corruptions ---------------------------------------------------------------

def _replace(arr: pa.Array, path: tuple[str, ...], make: Callable[[pa.Array], pa.Array | None]) -> pa.Array:
    """``arr`` with the struct field at ``path`` replaced by ``make(old)`` (``None`` drops the field)."""
    if not path:
        new = make(arr)
        assert new is not None
        return new
    names = [f.name for f in arr.type]
    children: list[pa.Array] = []
    kept: list[str] = []
    for name in names:
        child = arr.field(name)
        if name == path[0]:
            child = _replace(child, path[1:], make) if len(path) > 1 else make(child)
            if child is None:
                continue
        children.append(child)
        kept.append(name)
    return pa.StructArray.from_arrays(children, names=kept, mask=arr.is_null())


def _mutate_column(table: pa.Table, column: str, path: tuple[str, ...],
                   make: Callable[[pa.Array], pa.Array | None]) -> pa.Table:
    arr = table.column(column).combine_chunks()
    new = _replace(arr, path, make)
    return table.set_column(table.schema.get_field_index(column), column, new)


def _const(value: Any, type_: pa.DataType | None = None) -> Callable[[pa.Array], pa.Array]:
    return lambda old: pa.array([value] * len(old), type=type_)


def _null_where_valid(old: pa.Array) -> pa.Array:
    return pa.nulls(len(old), type=old.type)


CHECKPOINT_CASES: dict[str, tuple[str, tuple[str, ...], Callable[[pa.Array], pa.Array | None]]] = {
    "add is a string": ("add", (), _const("x")),
    "add has no path": ("add", ("path",), lambda old: None),
    "add has no partitionValues": ("add", ("partitionValues",), lambda old: None),
    "add path is null": ("add", ("path",), _null_where_valid),
    "add path is an int": ("add", ("path",), _const(5, pa.int64())),
    "partitionValues map to ints": ("add", ("partitionValues",),
                                    _const([("date", 1)], pa.map_(pa.string(), pa.int64()))),
    "partitionValues is a string": ("add", ("partitionValues",), _const("date=1")),
    "size is a string": ("add", ("size",), _const("100")),
    "size is negative": ("add", ("size",), _const(-1, pa.int64())),
    "modificationTime above int64": ("add", ("modificationTime",), _const(2**64 - 1, pa.uint64())),
    "dataChange is a string": ("add", ("dataChange",), _const("true")),
    "stats is an int": ("add", ("stats",), _const(5, pa.int64())),
    "deletionVector is a string": ("add", ("deletionVector",), _const("dv")),
    "deletionVector cardinality is null": ("add", ("deletionVector", "cardinality"), _null_where_valid),
    "deletionVector offset is negative": ("add", ("deletionVector", "offset"), _const(-5, pa.int32())),
    "protocol minReaderVersion is a string": ("protocol", ("minReaderVersion",), _const("1")),
    "protocol readerFeatures are ints": ("protocol", ("readerFeatures",), _const([1], pa.list_(pa.int64()))),
    "metaData configuration maps to ints": ("metaData", ("configuration",),
                                            _const([("k", 1)], pa.map_(pa.string(), pa.int64()))),
    "metaData schemaString is an int": ("metaData", ("schemaString",), _const(5, pa.int64())),
    "metaData partitionColumns are ints": ("metaData", ("partitionColumns",), _const([1], pa.list_(pa.int64()))),
    "txn version is a string": ("txn", ("version",), _const("3")),
    "txn version is negative": ("txn", ("version",), _const(-3, pa.int64())),
    "domainMetadata removed is a string": ("domainMetadata", ("removed",), _const("false")),
}


@pytest.fixture
def checkpointed(table) -> tuple[LogBuilder, str]:
    table.commit(commit_info(), add("date=2024-01-01/country=DE/a.parquet", DE, stats=STATS),
                 add("date=2024-01-02/country=FR/b.parquet", FR, dv=dv("inline")), txn("app", 3), domain("d"))
    (name,) = table.checkpoint(1)
    table.commit(commit_info(), remove("date=2024-01-01/country=DE/a.parquet"))
    return table, os.path.join(table.log_dir, name)


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES), ids=list(CHECKPOINT_CASES))
def test_malformed_checkpoint_is_log_corrupt_naming_the_file(checkpointed, case):
    b, path = checkpointed
    column, field_path, make = CHECKPOINT_CASES[case]
    pq.write_table(_mutate_column(pq.read_table(path), column, field_path, make), path)
    err = _raises_corrupt(b.root)
    assert err.path == path, err


def test_checkpoint_without_protocol_column_or_with_null_metadata(checkpointed):
    b, path = checkpointed
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["protocol"]), path)
    assert "no protocol action" in str(_raises_corrupt(b.root))
    pq.write_table(_mutate_column(table, "metaData", (), _null_where_valid), path)
    assert "no metaData action" in str(_raises_corrupt(b.root))


# -- fuzzing ----------------------------------------------------------------------------------------

LAYOUTS = ("commits", "classic", "v2")


def _build(root: str, layout: str) -> None:
    b = LogBuilder(root)
    b.commit(commit_info("CREATE TABLE"), protocol(3, 7, ["deletionVectors"], ["deletionVectors"]),
             metadata(configuration={"delta.enableDeletionVectors": "true", "delta.isolationLevel": "Serializable"}))
    b.commit(commit_info(), add("date=2024-01-01/country=DE/a.parquet", DE, stats=STATS),
             add("date=2024-01-02/country=FR/b.parquet", FR, stats=STATS), txn("app", 1), domain("d1"))
    b.commit(commit_info("DELETE", readVersion=1, isBlindAppend=False, tags={"k": "v"}),
             remove("date=2024-01-01/country=DE/a.parquet"),
             add("date=2024-01-01/country=DE/a.parquet", DE, stats=STATS, dv=dv("inline1")),
             add("date=2024-01-02/c.parquet", {"date": "2024-01-02", "country": None}), txn("app", 2))
    if layout == "classic":
        b.checkpoint(2)
    elif layout == "v2":
        b.v2_checkpoint(2, sidecars=1)
    b.commit(commit_info("WRITE", inCommitTimestamp=1700000000005, operationMetrics={"numFiles": "1"}),
             remove("date=2024-01-02/country=FR/b.parquet"),
             add("date=2024-01-03/country=DE/d.parquet", {"date": "2024-01-03", "country": "DE"}),
             metadata(configuration={"delta.enableDeletionVectors": "true", "k": "v"}))
    b.commit(commit_info(), add("date=2024-01-03/country=FR/e.parquet", {"date": "2024-01-03", "country": "FR"},
                                stats=STATS),
             domain("d1", removed=True),
             {"cdc": {"path": "_change_data/c.parquet", "partitionValues": DE, "size": 5, "dataChange": False}})


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, str]:
    roots = {}
    for layout in LAYOUTS:
        roots[layout] = str(tmp_path_factory.mktemp(layout) / "t")
        _build(roots[layout], layout)
    return roots


def test_unmutated_templates_load(templates):
    for root in templates.values():
        snap = DeltaLog.for_table(root).snapshot()
        assert snap.version == 4 and snap.num_files == 4
        _exercise(DeltaLog.for_table(root), tolerate=False)


def _log_files(root: str, suffixes: tuple[str, ...]) -> list[str]:
    found = []
    for directory, _, names in os.walk(os.path.join(root, "_delta_log")):
        found.extend(os.path.join(directory, n) for n in names if n.endswith(suffixes) and n[0] != "_")
    return sorted(found)


RAW_TOKENS = ["1e400", "-1e400", "NaN", "Infinity", "-0", "9223372036854775808", "-9223372036854775809",
              "1.5", "1" * 5000, "[" * 900 + "]" * 900, NESTED, '"\\ud800"', '"\\u0000"']
_RAW = "\x00raw\x00"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
    | st.text(max_size=8) | st.sampled_from(["", "2024-01-01", "DE", "u", "x.parquet", "long", "struct", "true"]),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["path", "type", "size", "version", "id", "date", "country"])
                      | st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _set(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    value[path[0]] = _set(value[path[0]], path[1:], new)
    return value


def _mutate_value(data: st.DataObject, value: Any) -> tuple[Any, str | None]:
    """One mutation somewhere in a decoded JSON value; returns it and the raw text to splice in, if any."""
    paths = _paths(value)
    path = data.draw(st.sampled_from(paths), label="path")
    op = data.draw(st.sampled_from(["replace", "raw", "delete", "embedded"]), label="op")
    target: Any = value
    for key in path:
        target = target[key]
    if op == "delete" and path:
        parent: Any = value
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
        return value, None
    if op == "embedded" and isinstance(target, str) and target[:1] in ("{", "["):
        try:
            inner = json.loads(target)
        except ValueError:
            inner = None
        if inner is not None:
            mutated, raw = _mutate_value(data, inner)
            text = json.dumps(mutated)
            if raw is not None:
                text = text.replace(json.dumps(_RAW), raw)
            return _set(value, path, text), None
    if op == "raw":
        return _set(value, path, _RAW), data.draw(st.sampled_from(RAW_TOKENS), label="raw")
    return _set(value, path, data.draw(json_values, label="value")), None


def _mutate_json_file(data: st.DataObject, path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        lines = [line for line in fh.read().split("\n") if line]
    op = data.draw(st.sampled_from(["value", "value", "value", "duplicate", "drop", "truncate", "swap"]),
                   label="line op")
    i = data.draw(st.integers(0, len(lines) - 1), label="line")
    try:
        decoded = json.loads(lines[i]) if op == "value" else None
    except (ValueError, RecursionError):
        return  # an earlier mutation already broke this line
    if op == "value":
        mutated, raw = _mutate_value(data, decoded)
        text = json.dumps(mutated)
        lines[i] = text.replace(json.dumps(_RAW), raw) if raw is not None else text
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "drop":
        del lines[i]
    elif op == "truncate":
        lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])), label="cut")]
    else:
        j = data.draw(st.integers(0, len(lines) - 1), label="other line")
        lines[i], lines[j] = lines[j], lines[i]
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write("\n".join(lines) + "\n")


def _struct_paths(type_: pa.DataType, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [prefix]
    if pa.types.is_struct(type_) and len(prefix) < 2:
        for f in type_:
            out.extend(_struct_paths(f.type, (*prefix, f.name)))
    return out


ARROW_VALUES: list[tuple[Any, pa.DataType]] = [
    ("x", pa.string()), (-1, pa.int64()), (0, pa.int32()), (2**63 - 1, pa.int64()), (2**64 - 1, pa.uint64()),
    (1.5, pa.float64()), (float("nan"), pa.float64()), (True, pa.bool_()), (b"\xff", pa.binary()),
    ([("date", 1)], pa.map_(pa.string(), pa.int64())), ([("date", "1")], pa.map_(pa.string(), pa.string())),
    ([1, 2], pa.list_(pa.int64())), (["a"], pa.list_(pa.string())), ({"a": 1}, pa.struct([("a", pa.int64())])),
]


def _mutate_parquet_file(data: st.DataObject, path: str) -> None:
    table = pq.read_table(path)
    op = data.draw(st.sampled_from(["drop column", "field", "field", "field", "null rows"]), label="parquet op")
    column = data.draw(st.sampled_from(table.column_names), label="column")
    if op == "drop column":
        table = table.drop_columns([column])
    elif op == "null rows":
        arr = table.column(column).combine_chunks()
        nulls = pa.array(data.draw(st.lists(st.booleans(), min_size=len(arr), max_size=len(arr)), label="nulls"))
        if not pa.types.is_struct(arr.type):
            return
        children = [arr.field(f.name) for f in arr.type]
        masked = pa.StructArray.from_arrays(children, fields=list(arr.type), mask=pc.or_(arr.is_null(), nulls))
        table = table.set_column(table.schema.get_field_index(column), column, masked)
    else:
        field_path = data.draw(st.sampled_from(_struct_paths(table.schema.field(column).type)[1:] or [()]),
                               label="field")
        if not field_path:
            return
        kind = data.draw(st.sampled_from(["drop", "nulls", "value"]), label="field op")
        if kind == "drop":
            make: Callable[[pa.Array], pa.Array | None] = lambda old: None  # noqa: E731
        elif kind == "nulls":
            make = _null_where_valid
        else:
            value, type_ = data.draw(st.sampled_from(ARROW_VALUES), label="arrow value")
            make = _const(value, type_)
        try:
            table = _mutate_column(table, column, field_path, make)
        except (pa.ArrowInvalid, ValueError):
            return  # a struct cannot lose its last field
    try:
        pq.write_table(table, path + ".tmp")
    except pa.ArrowNotImplementedError:
        return  # Parquet cannot store a struct without fields: the file keeps its valid content
    os.replace(path + ".tmp", path)


def _fuzz(data: st.DataObject, templates: dict[str, str], suffixes: tuple[str, ...],
          mutate: Callable[[st.DataObject, str], None]) -> None:
    layouts = [layout for layout in LAYOUTS if _log_files(templates[layout], suffixes)]
    layout = data.draw(st.sampled_from(layouts), label="layout")
    with tempfile.TemporaryDirectory(prefix="occ-fuzz-") as tmp:
        root = os.path.join(tmp, "t")
        shutil.copytree(templates[layout], root)
        files = _log_files(root, suffixes)
        for _ in range(data.draw(st.integers(1, 3), label="mutations")):
            mutate(data, data.draw(st.sampled_from(files), label="file"))
        _exercise(DeltaLog.for_table(root), tolerate=True)


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data())
def test_fuzzed_json_commits_raise_only_typed_errors(templates, data):
    _fuzz(data, templates, (".json",), _mutate_json_file)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(data=st.data())
def test_fuzzed_checkpoints_raise_only_typed_errors(templates, data):
    _fuzz(data, templates, (".parquet",), _mutate_parquet_file)
