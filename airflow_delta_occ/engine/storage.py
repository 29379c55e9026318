"""Storage access for the log: list, read, and put-if-absent.

The engine reads ``_delta_log`` through the small ``Storage`` protocol so that the same code runs
on a local disk (fast path through ``os``, and an atomic put-if-absent with ``link``) and on any
filesystem pyarrow understands (S3, GCS, HDFS, ABFS) through ``PyArrowStorage``.

Invariants every implementation keeps:

- ``list_dir`` returns the entries of one directory sorted by name and raises ``FileNotFoundError``
  when the directory does not exist.
- ``put_if_absent`` either creates the complete file or raises ``FileAlreadyExistsError``; a reader
  never sees a partially written file (mutual exclusion of Delta commits rests on this).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Protocol
from urllib.parse import unquote, urlparse

from .errors import FileAlreadyExistsError, StorageError, UnsupportedStorageError
from .object_store import StorageCredentials, open_filesystem, parse_table_uri, redact_uri


@dataclass(frozen=True, slots=True)
class FileMeta:
    """One directory entry: ``path`` is usable with the same ``Storage``; times are epoch ms."""

    path: str
    name: str
    size: int
    modification_time: int


class Storage(Protocol):
    def list_dir(self, path: str) -> list[FileMeta]:
        """Files directly under ``path``, sorted by name."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def open_input(self, path: str) -> IO[bytes]:
        """A seekable binary stream (Parquet readers need random access)."""
        ...

    def exists(self, path: str) -> bool: ...

    def put_if_absent(self, path: str, data: bytes) -> None: ...

    def join(self, *parts: str) -> str: ...


class LocalStorage:
    """The local filesystem through ``os``: the fastest listing and an atomic exclusive create."""

    def list_dir(self, path: str) -> list[FileMeta]:
        entries: list[FileMeta] = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    if not entry.is_file():
                        continue
                    st = entry.stat()
                except FileNotFoundError:
                    continue  # a writer's temp file vanished between listing and stat
                entries.append(FileMeta(entry.path, entry.name, st.st_size, st.st_mtime_ns // 1_000_000))
        entries.sort(key=lambda e: e.name)
        return entries

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    def open_input(self, path: str) -> IO[bytes]:
        return open(path, "rb")

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def put_if_absent(self, path: str, data: bytes) -> None:
        # Write a private temp file, then hard-link it into place: link() fails if the target
        # exists, and the target appears complete or not at all.
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)  # the first commit of a new table creates _delta_log
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise FileAlreadyExistsError(path) from exc
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)


class PyArrowStorage:
    """Any ``pyarrow.fs.FileSystem``; put-if-absent is refused where the store cannot guarantee it."""

    def __init__(self, filesystem: object) -> None:
        self._fs = filesystem

    def list_dir(self, path: str) -> list[FileMeta]:
        import pyarrow.fs as pafs

        fs: pafs.FileSystem = self._fs
        with _store_errors("list", path):
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(path)
            infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=False))
        entries = []
        for fi in infos:
            if fi.type == pafs.FileType.File:
                mtime = int(fi.mtime_ns // 1_000_000) if fi.mtime_ns is not None else 0
                entries.append(FileMeta(fi.path, fi.base_name, int(fi.size or 0), mtime))
        entries.sort(key=lambda e: e.name)
        return entries

    def read_bytes(self, path: str) -> bytes:
        with self.open_input(path) as fh, _store_errors("read", path):
            return fh.read()

    def open_input(self, path: str) -> IO[bytes]:
        with _store_errors("open", path):
            stream: IO[bytes] = self._fs.open_input_file(path)  # type: ignore[attr-defined]
        return stream

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        with _store_errors("look up", path):
            info = self._fs.get_file_info(path)  # type: ignore[attr-defined]
        return bool(info.type != pafs.FileType.NotFound)

    def put_if_absent(self, path: str, data: bytes) -> None:
        raise StorageError(
            f"put-if-absent is not available for {type(self._fs).__name__}; commits to this store "
            "need a LogStore with mutual exclusion (for example a local or conditional-write store)"
        )

    def join(self, *parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts)


@contextlib.contextmanager
def _store_errors(action: str, path: str) -> Iterator[None]:
    """A store that refuses or cannot be reached is a ``StorageError`` naming the path; a missing
    file stays ``FileNotFoundError``, which the log reader turns into its own answers."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as exc:  # pyarrow reports network, permission and service errors as OSError
        raise StorageError(f"cannot {action} {path}: {exc}") from exc


def resolve_table(table_uri: str, credentials: StorageCredentials | None = None) -> tuple[Storage, str]:
    """Storage and root path for a table given as a local path, ``file:`` URI or object-store URI.

    Object stores are named as Spark users write them (``s3a://``, ``s3://``, ``abfss://``,
    ``gs://``, ``hdfs://``; see ``object_store``); ``credentials`` are used for them when given.

    Raises:
        UnsupportedStorageError: an unknown scheme, a ``file:`` URI naming another host (it would be
            read here as a local path, while a conflict pool refuses it), or credentials for another
            store. Messages quote the URI with its credentials as ``***`` (``redact_uri``).
        StorageError: the store cannot be opened.
    """
    shown = redact_uri(table_uri)
    try:
        parsed = urlparse(table_uri)
    except ValueError as exc:  # an unclosed IPv6 bracket
        raise UnsupportedStorageError(f"cannot read {shown!r}: not a URI ({exc})") from None
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        if parsed.scheme == "file" and parsed.netloc.lower() not in ("", "localhost") and os.name != "nt":
            raise UnsupportedStorageError(f"cannot read {shown!r}: a file: URI on another host (or with user "
                                          "info); give a local path, or the store's own URI")
        if credentials is not None:
            raise UnsupportedStorageError(f"{shown} is a local path; storage credentials apply to object stores")
        local = unquote(parsed.path) if parsed.scheme == "file" else table_uri
        return LocalStorage(), os.path.abspath(local)
    location = parse_table_uri(table_uri)
    return PyArrowStorage(open_filesystem(location, credentials)), location.root
