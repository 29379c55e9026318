"""``HadoopStorage``, the spark-submit driver's log reader, against a stand-in for py4j's JVM view: which Java errors
are "not there yet" (the watch's usual answer) and which are failures, and that it never writes.

The real path (a standalone cluster's driver reading a real log) is tests/spark/test_early_abort.py's spark-submit
case; this pins the error mapping, which that run meets only for a missing next commit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_delta_occ.engine.errors import StorageError
from airflow_delta_occ.spark.hadoop_storage import HadoopStorage


class JavaError(Exception):
    """What py4j raises for a Java exception: ``Py4JJavaError`` carries it as ``java_exception``."""

    def __init__(self, class_name: str, message: str, *, missing: bool) -> None:
        super().__init__(message)
        self.java_exception = SimpleNamespace(
            missing=missing, getClass=lambda: SimpleNamespace(getName=lambda: class_name),
            getMessage=lambda: message)


class FakeFileSystem:
    def __init__(self, files: dict[str, bytes], failures: dict[str, BaseException]) -> None:
        self.files, self.failures = files, failures

    def _check(self, path: str) -> None:
        if path in self.failures:
            raise self.failures[path]
        if path not in self.files and not any(f.startswith(path.rstrip("/") + "/") for f in self.files):
            raise JavaError("java.io.FileNotFoundException", f"File {path} does not exist", missing=True)

    def open(self, path: Any) -> Any:
        self._check(path.name)
        return SimpleNamespace(data=self.files[path.name], close=lambda: None)

    def exists(self, path: Any) -> bool:
        if path.name in self.failures:
            raise self.failures[path.name]
        return path.name in self.files

    def listStatus(self, path: Any) -> list[Any]:
        self._check(path.name)
        prefix = path.name.rstrip("/") + "/"
        children = {f[len(prefix):].split("/")[0] for f in self.files if f.startswith(prefix)}
        return [SimpleNamespace(
            getPath=lambda c=c: SimpleNamespace(toString=lambda c=c: prefix + c, getName=lambda c=c: c),
            getLen=lambda c=c: len(self.files.get(prefix + c, b"")), getModificationTime=lambda: 1700000000000,
            isFile=lambda c=c: prefix + c in self.files) for c in sorted(children, reverse=True)]


def _storage(files: dict[str, bytes], failures: dict[str, BaseException] | None = None
             ) -> tuple[HadoopStorage, list[str]]:
    fs = FakeFileSystem(files, failures or {})
    looked_up: list[str] = []

    def for_name(name: str) -> Any:
        looked_up.append(name)
        return SimpleNamespace(isInstance=lambda java: bool(getattr(java, "missing", False)))

    def hadoop_path(name: str) -> Any:
        return SimpleNamespace(name=name, getFileSystem=lambda conf: fs)

    jvm = SimpleNamespace(
        java=SimpleNamespace(lang=SimpleNamespace(Class=SimpleNamespace(forName=for_name))),
        org=SimpleNamespace(apache=SimpleNamespace(
            hadoop=SimpleNamespace(fs=SimpleNamespace(Path=hadoop_path)),
            commons=SimpleNamespace(io=SimpleNamespace(IOUtils=SimpleNamespace(toByteArray=lambda s: s.data))))))
    session = SimpleNamespace(sparkContext=SimpleNamespace(_jvm=jvm), _jsparkSession=SimpleNamespace(
        sessionState=lambda: SimpleNamespace(newHadoopConf=lambda: "conf")))
    return HadoopStorage(session), looked_up


def test_a_missing_file_is_not_there_yet_and_the_class_is_looked_up_once() -> None:
    storage, looked_up = _storage({"/t/_delta_log/00000000000000000000.json": b"{}"})
    assert storage.read_bytes("/t/_delta_log/00000000000000000000.json") == b"{}"
    for _ in range(3):   # the watch's poll for a next commit that has not landed
        with pytest.raises(FileNotFoundError, match=r"00000000000000000001\.json"):
            storage.read_bytes("/t/_delta_log/00000000000000000001.json")
    assert looked_up == ["java.io.FileNotFoundException"]


def test_any_other_java_error_is_a_storage_error_naming_the_path_never_not_there() -> None:
    denied = JavaError("java.nio.file.AccessDeniedException", "s3a://lake/t/_delta_log/1.json: 403 Forbidden",
                       missing=False)
    storage, _ = _storage({}, {"s3a://lake/t/_delta_log/1.json": denied})
    with pytest.raises(StorageError, match=r"cannot read s3a://lake/t/_delta_log/1\.json: "
                                           r"java\.nio\.file\.AccessDeniedException: .*403 Forbidden") as raised:
        storage.read_bytes("s3a://lake/t/_delta_log/1.json")
    assert not isinstance(raised.value, FileNotFoundError)
    with pytest.raises(StorageError, match="cannot check"):
        storage.exists("s3a://lake/t/_delta_log/1.json")


def test_a_python_error_is_not_taken_for_a_java_one() -> None:
    storage, _ = _storage({}, {"/t/x": KeyError("py4j gateway closed")})
    with pytest.raises(KeyError, match="gateway closed"):
        storage.read_bytes("/t/x")


def test_listing_keeps_files_only_sorted_by_name() -> None:
    storage, _ = _storage({"/t/_delta_log/00000000000000000001.json": b"ab",
                           "/t/_delta_log/00000000000000000000.json": b"a",
                           "/t/_delta_log/_sidecars/x.parquet": b"xyz"})
    entries = storage.list_dir("/t/_delta_log")
    assert [(e.name, e.size) for e in entries] == [("00000000000000000000.json", 1), ("00000000000000000001.json", 2)]
    with pytest.raises(FileNotFoundError):
        storage.list_dir("/nowhere/_delta_log")


def test_it_never_writes() -> None:
    storage, _ = _storage({})
    with pytest.raises(StorageError, match="read-only"):
        storage.put_if_absent("/t/_delta_log/00000000000000000002.json", b"{}")
    assert storage.join("s3a://lake/t/", "/_delta_log/", "1.json") == "s3a://lake/t/_delta_log/1.json"
