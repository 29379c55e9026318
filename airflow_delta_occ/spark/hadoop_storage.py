"""The engine's ``Storage`` over a Spark driver's Hadoop file system, for reading a table's Delta log where the
job runs.

A ``spark-submit`` driver may run on another host than the Airflow task, with credentials the task never
sees (an instance role, a cluster's own keys). Reading the log through the driver's own Hadoop
configuration (``sessionState().newHadoopConf()``: the ``spark.hadoop.*`` settings and the session's) reads
it exactly where, and as, Spark reads the table, so early abort in that mode needs no credentials of its
own. Read-only: the engine never writes a commit from a driver.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import IO, Any

from airflow_delta_occ.engine.errors import StorageError
from airflow_delta_occ.engine.storage import FileMeta


class HadoopStorage:
    """``Storage`` through py4j: Hadoop ``FileSystem`` calls on the driver's JVM (classic sessions only)."""

    def __init__(self, session: Any) -> None:
        self._jvm = session.sparkContext._jvm
        self._conf = session._jsparkSession.sessionState().newHadoopConf()
        # Looked up once: the watch's usual poll finds no next commit, so this check runs at every interval.
        self._missing = self._jvm.java.lang.Class.forName("java.io.FileNotFoundException")

    def _path(self, path: str) -> tuple[Any, Any]:
        hadoop_path = self._jvm.org.apache.hadoop.fs.Path(path)
        return hadoop_path.getFileSystem(self._conf), hadoop_path

    def list_dir(self, path: str) -> list[FileMeta]:
        with self._java_errors("list", path):
            fs, hadoop_path = self._path(path)
            statuses = fs.listStatus(hadoop_path)
        entries = [FileMeta(str(s.getPath().toString()), str(s.getPath().getName()), int(s.getLen()),
                            int(s.getModificationTime())) for s in statuses if s.isFile()]
        entries.sort(key=lambda e: e.name)
        return entries

    def read_bytes(self, path: str) -> bytes:
        with self._java_errors("read", path):
            fs, hadoop_path = self._path(path)
            stream = fs.open(hadoop_path)
            try:
                data = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
            finally:
                stream.close()
        return bytes(data)

    def open_input(self, path: str) -> IO[bytes]:
        return io.BytesIO(self.read_bytes(path))

    def exists(self, path: str) -> bool:
        with self._java_errors("check", path):
            fs, hadoop_path = self._path(path)
            return bool(fs.exists(hadoop_path))

    def put_if_absent(self, path: str, data: bytes) -> None:
        raise StorageError(f"cannot write {path}: the driver's log reader is read-only")

    def join(self, *parts: str) -> str:
        head, *rest = parts
        return "/".join([head.rstrip("/"), *(p.strip("/") for p in rest)])

    @contextlib.contextmanager
    def _java_errors(self, action: str, path: str) -> Iterator[None]:
        """A missing file (``FileNotFoundException`` or a subclass) stays ``FileNotFoundError``, the log reader's
        "not there yet"; any other Java error is a ``StorageError`` naming the path, never "not there"."""
        try:
            yield
        except Exception as exc:
            java = getattr(exc, "java_exception", None)   # py4j's Py4JJavaError
            if java is None:
                raise
            if self._missing.isInstance(java):
                raise FileNotFoundError(path) from exc
            raise StorageError(f"cannot {action} {path}: {java.getClass().getName()}: {java.getMessage()}") from exc
