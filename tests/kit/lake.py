"""The shared store's tests and benches: the project's test Postgres (``tests/pg/pg.sh``), started once for the
session, and a fresh lake (its own catalog database and data directory) for each test.

A lake is named as a user names one: ``ducklake:postgres:<conninfo>`` with no password in it. libpq reads the
passwords from the passfile the script writes (``PGPASSFILE``, set here for the whole test process and the
commands it starts). :data:`PASSWORDS` are those passwords: a test asserts they are nowhere sbench writes.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from .paths import ROOT

PG_SCRIPT = ROOT / "tests" / "pg" / "pg.sh"
PASSWORDS = ("bench-writer-pw", "bench-reader-pw")  # what tests/pg/pg.sh gives its roles
WRITER, READER = "bench", "bench_reader"


@dataclass(frozen=True)
class PgServer:
    """A running test Postgres: where it listens, and its admin's socket directory."""

    host: str
    port: int
    socket: str
    root: Path  # SBENCH_PG_DIR
    env: dict[str, str]  # what a client needs: PGPASSFILE, PGSERVICEFILE

    def psql(self, sql: str, db: str = "postgres") -> str:
        """Run *sql* as the server's superuser (through its socket); its output."""
        cmd = ["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", "-h", self.socket, "-p", str(self.port),
               "-U", "postgres", "-d", db, "-c", sql]
        if os.getuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    def conninfo(self, dbname: str, user: str = WRITER) -> str:
        return f"dbname={dbname} host={self.host} port={self.port} user={user}"

    def new_lake(self, data: Path, user: str = WRITER) -> tuple[str, Path]:
        """A new, empty catalog database (owned by the writer, readable by the reader role): the ``--db`` text
        of a lake on it as *user*, and its data directory *data*."""
        name = "lake_" + uuid.uuid4().hex[:12]
        self.psql(f"CREATE DATABASE {name} OWNER {WRITER}")
        self.psql(f"GRANT CONNECT ON DATABASE {name} TO {READER}; GRANT USAGE ON SCHEMA public TO {READER}; "
                  f"ALTER DEFAULT PRIVILEGES FOR ROLE {WRITER} IN SCHEMA public GRANT SELECT ON TABLES TO {READER}",
                  db=name)
        return "ducklake:postgres:" + self.conninfo(name, user), data

    def stop(self) -> None:
        run_script("stop", self.root, self.port)

    def start(self) -> None:
        run_script("start", self.root, self.port)


def run_script(verb: str, root: Path, port: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SBENCH_PG_DIR": str(root), "SBENCH_PG_PORT": str(port)}
    proc = subprocess.run(["bash", str(PG_SCRIPT), verb], capture_output=True, text=True, env=env)
    if verb != "status" and proc.returncode != 0:
        raise RuntimeError(f"tests/pg/pg.sh {verb} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_server(root: Path | None = None, port: int | None = None) -> PgServer:
    """The test Postgres at *root* on *port* (default: the script's own, shared by the session), started when it
    is not running (under a lock: several xdist workers may ask at once); its client files in this process's
    environment."""
    root = root or Path(os.environ.get("SBENCH_PG_DIR") or "/var/lib/sbench-pg")
    port = port or int(os.environ.get("SBENCH_PG_PORT") or 55432)
    lock_path = Path(tempfile.gettempdir()) / f"sbench-pg-{port}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if run_script("status", root, port).returncode != 0:
            run_script("start", root, port)
    env = {"PGPASSFILE": str(root / "pgpass"), "PGSERVICEFILE": str(root / "pg_service.conf")}
    return PgServer("127.0.0.1", port, str(root / "run"), root, env)


__all__ = ["PASSWORDS", "PG_SCRIPT", "READER", "WRITER", "PgServer", "start_server"]
