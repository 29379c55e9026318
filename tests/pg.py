"""A throwaway PostgreSQL server for the ``postgres`` tier, started and stopped by the tests themselves.

``PostgresServer`` runs ``initdb`` into a temporary directory and ``pg_ctl start`` on a free loopback port,
with durability off (``fsync``, ``synchronous_commit``, ``full_page_writes``): the cluster only lives for one
test session. It never uses a PostgreSQL service already running on the machine (Debian's ``main`` cluster on
port 5432, say), and ``stop()`` kills it and deletes its directory.

``initdb`` refuses to run as root, so under root the server's commands run as an unprivileged user through
``runuser``: the ``postgres`` system user of the Debian package, else a dedicated ``delta_occ_pg`` user that is
created with ``useradd``. Clients connect over TCP as the ``delta_occ`` superuser with ``trust`` authentication,
so no password is needed.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

SUPERUSER = "delta_occ"
DEFAULT_DATABASE = "delta_occ_test"
FALLBACK_OS_USER = "delta_occ_pg"
INSTALL_HINT = "install it with `apt-get update && apt-get install -y postgresql` (Debian/Ubuntu)"

_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def find_pg_bin() -> Path:
    """Directory holding ``initdb`` and ``pg_ctl``: the highest ``/usr/lib/postgresql/<version>/bin``, else PATH."""
    candidates = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    candidates = [d for d in candidates if (d / "pg_ctl").is_file()]
    if candidates:
        return max(candidates, key=lambda d: _version_key(d.parent.name))
    initdb = shutil.which("initdb")
    if initdb:
        bindir = Path(initdb).resolve().parent
        if (bindir / "pg_ctl").is_file():
            return bindir
        if shutil.which("pg_ctl"):
            # initdb and pg_ctl on PATH but in different folders: use PATH lookups for both.
            return Path(initdb).parent
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql/*/bin or on PATH: "
        + INSTALL_HINT
    )


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unprivileged_user() -> pwd.struct_passwd:
    for name in ("postgres", FALLBACK_OS_USER):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    if shutil.which("useradd") is None:
        raise RuntimeError("running as root without a `postgres` user and without `useradd` to create one")
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", FALLBACK_OS_USER],
        capture_output=True, text=True, check=False, timeout=60,
    )
    try:  # a concurrent session may have created it first; either way it must exist now
        return pwd.getpwnam(FALLBACK_OS_USER)
    except KeyError:
        raise RuntimeError(f"could not create the system user {FALLBACK_OS_USER!r} with useradd") from None


def _temp_parent(as_other_user: bool) -> str | None:
    """Where to make the temp dir: the default, unless another user could not reach into it (TMPDIR=/root/x)."""
    if not as_other_user:
        return None
    path = Path(tempfile.gettempdir()).resolve()
    for p in (path, *path.parents):
        if not p.stat().st_mode & stat.S_IXOTH:
            return "/tmp"
    return None


class PostgresCommandError(RuntimeError):
    """A PostgreSQL command line tool failed; the message carries its output."""


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, listening on ``127.0.0.1:port`` only.

    Use as a context manager, or call ``start()`` and ``stop()``. ``url`` is the SQLAlchemy URL of the database
    ``delta_occ_test``; ``create_database(name)`` makes another empty one and returns its URL.
    """

    def __init__(self, *, start_attempts: int = 3, start_timeout: int = 60,
                 settings: dict[str, str] | None = None) -> None:
        self.bindir = find_pg_bin()
        self.settings = dict(settings or {})   # more ``-c name=value`` server settings
        self.port = 0
        self.url = ""
        self.base: Path | None = None
        self._user: pwd.struct_passwd | None = pwd.getpwuid(os.getuid()) if os.geteuid() != 0 else None
        self._start_attempts = start_attempts
        self._start_timeout = start_timeout
        self._running = False
        self._lock = threading.Lock()

    # -- paths ---------------------------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.base is not None
        return self.base / "sock"

    @property
    def log_file(self) -> Path:
        assert self.base is not None
        return self.base / "postgres.log"

    @property
    def version(self) -> str:
        """``pg_ctl --version``, e.g. ``pg_ctl (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)``."""
        return self._run([self._tool("pg_ctl"), "--version"], as_server_user=False).stdout.strip()

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> PostgresServer:
        if self.base is not None:
            raise RuntimeError("PostgresServer already started")
        as_root = os.geteuid() == 0
        if as_root:
            self._user = _unprivileged_user()
        self.base = Path(tempfile.mkdtemp(prefix="delta_occ_pg_", dir=_temp_parent(as_root)))
        atexit.register(self.stop)  # a safety net if the interpreter exits without stopping the server
        try:
            if as_root:
                assert self._user is not None
                os.chown(self.base, self._user.pw_uid, self._user.pw_gid)
            self._mkdir_owned(self.socket_dir)
            self._run([self._tool("initdb"), "-D", str(self.data_dir), "-A", "trust", "-U", SUPERUSER,
                       "--encoding", "UTF8", "--locale", "C", "--no-sync"])
            self._start_on_free_port()
            self.url = self.create_database(DEFAULT_DATABASE)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (``pg_ctl -m immediate``) and delete its directory; safe to call twice."""
        base, self.base = self.base, None
        if base is None:
            return
        atexit.unregister(self.stop)
        try:
            if self._running:
                self._running = False
                self._run([self._tool("pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "-w",
                           "-t", str(self._start_timeout), "stop"], check=False)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    @property
    def postmaster_pid(self) -> int:
        """The server's main process (``postmaster.pid``'s first line); its children are the backends."""
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def crash(self) -> None:
        """Stop the server the way a crash does (``pg_ctl -m immediate``): connections drop, nothing is
        flushed; ``restart()`` brings it back on the same port with the same data."""
        self._run([self._tool("pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])
        self._running = False

    def restart(self) -> None:
        """Start a crashed (or stopped) server again on its port; it recovers from its write-ahead log."""
        opts = shlex.join(["-p", str(self.port), *self._options()])
        self._run([self._tool("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                   "-t", str(self._start_timeout), "-o", opts, "start"])
        self._running = True

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- databases -----------------------------------------------------------------------------------------

    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg2://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Create the empty database ``name`` (lower-case identifier) and return its SQLAlchemy URL."""
        if not _DB_NAME.fullmatch(name):
            raise ValueError(f"database name must match {_DB_NAME.pattern}: {name!r}")
        import psycopg2  # the `postgres`/`test` extra; imported late so this module imports without it

        with self._lock:
            conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres",
                                    connect_timeout=10)
            try:
                conn.autocommit = True  # CREATE DATABASE cannot run inside a transaction
                with conn.cursor() as cur:
                    cur.execute(f'CREATE DATABASE "{name}"')
            finally:
                conn.close()
        return self.url_for(name)

    # -- internals -----------------------------------------------------------------------------------------

    def _options(self) -> list[str]:
        return [
            "-k", str(self.socket_dir),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=200",
            "-c", "shared_buffers=32MB",
            *(arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")),
        ]

    def _start_on_free_port(self) -> None:
        options = self._options()
        last_error: PostgresCommandError | None = None
        for _ in range(self._start_attempts):
            # Another process may take the port between free_port() and the bind: retry on a fresh one.
            port = free_port()
            opts = shlex.join(["-p", str(port), *options])
            try:
                self._run([self._tool("pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
                           "-t", str(self._start_timeout), "-o", opts, "start"])
            except PostgresCommandError as e:
                last_error = e
                self._run([self._tool("pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "stop"], check=False)
                continue
            self.port = port
            self._running = True
            return
        log = self.log_file.read_text(errors="replace")[-4000:] if self.log_file.exists() else ""
        raise RuntimeError(f"PostgreSQL did not start after {self._start_attempts} attempts.\n"
                           f"{last_error}\nserver log tail:\n{log}")

    def _tool(self, name: str) -> str:
        path = self.bindir / name
        if path.is_file():
            return str(path)
        found = shutil.which(name)
        if found is None:
            raise RuntimeError(f"PostgreSQL tool {name!r} not found next to initdb or on PATH: {INSTALL_HINT}")
        return found

    def _mkdir_owned(self, path: Path) -> None:
        path.mkdir(mode=0o700)
        if os.geteuid() == 0 and self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _run(self, cmd: list[str], *, check: bool = True, as_server_user: bool = True,
             ) -> subprocess.CompletedProcess[str]:
        # Drop PG* variables (PGPORT, PGHOST, PGDATA, ...) so only our arguments decide where things go.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        if as_server_user and os.geteuid() == 0:
            assert self._user is not None
            cmd = ["runuser", "-u", self._user.pw_name, "--", *cmd]
        cwd = str(self.base) if self.base is not None and self.base.exists() else "/"
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True, timeout=self._start_timeout + 60, check=False)
        if check and proc.returncode != 0:
            raise PostgresCommandError(f"{shlex.join(cmd)} exited with {proc.returncode}:\n{proc.stdout}")
        return proc


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """``with postgres_server() as server:`` a started ``PostgresServer``, stopped and deleted on exit."""
    with PostgresServer() as server:
        yield server
