"""A throwaway PostgreSQL cluster that a test may stop, restart and misconfigure (scripts/pg.sh)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_MAJOR = 15  # scripts/pg.sh's server; the other majors come from scripts/pg_versions.sh


def pg_bindir(major: int) -> str:
    """The bin directory of PostgreSQL `major` (scripts/pg_versions.sh); a clear error when not installed."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/pg_versions.sh"), "bindir", str(major)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return out.stdout.strip()


def matrix_major() -> int | None:
    """The major the PostgreSQL matrix runs on (scripts/test_pg_matrix.sh sets CHANGELAKE_PG_MATRIX), else None.

    None (Debian's 15, scripts/pg.sh) outside the matrix, and for 15 inside it.
    """
    major = os.environ.get("CHANGELAKE_PG_MATRIX")
    return None if not major or int(major) == DEBIAN_MAJOR else int(major)


def copy_data_dir(src: Path, dst: Path) -> None:
    """A cold copy of a stopped cluster's data directory (what a storage snapshot restores), replacing `dst`."""
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


class ScratchCluster:
    """Owns one cluster in a temporary state directory on its own port; `remove()` deletes it.

    Tests give fixed ports below the kernel's ephemeral range (32768-60999 by default): a port in
    it can be taken at any moment by a socket bound to port 0, such as the random listen ports of
    the Spark JVMs the other test worker runs, and the cluster then fails to start (it did, once,
    in a full suite: "could not bind IPv4 address: Address already in use").
    """

    def __init__(self, port: int, major: int | None = None) -> None:
        """Create and start the cluster (initdb on first start, `wal_level = logical`).

        `major` picks a PostgreSQL major of scripts/pg_versions.sh (its binaries must be installed:
        `make setup`); None is the major the suite runs on: the Debian one scripts/pg.sh installs,
        or the matrix's (matrix_major). A major that is not installed raises (pg_bindir): the test
        errors, never skips, so a major lost from the install fails CI.
        """
        major = matrix_major() if major is None else major
        bindir = None if major is None or major == DEBIAN_MAJOR else pg_bindir(major)  # before any file is made
        self.state = Path(tempfile.mkdtemp(prefix="changelake-scratch-", dir="/tmp"))
        self.state.chmod(0o755)
        self.env = dict(os.environ, CHANGELAKE_STATE=str(self.state), CHANGELAKE_PG_PORT=str(port))
        if bindir is not None:
            self.env["CHANGELAKE_PG_BINDIR"] = bindir
        self.dsn = self._pg("start").strip().splitlines()[-1]

    def _pg(self, command: str) -> str:
        out = subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), command], env=self.env, capture_output=True, text=True
        )
        if out.returncode != 0:  # say why: the server's log holds the reason pg_ctl gives none for
            log = self.state / "pgdata" / "server.log"
            tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
            raise RuntimeError(
                f"scripts/pg.sh {command} (port {self.env['CHANGELAKE_PG_PORT']}) exited {out.returncode}: "
                f"{out.stderr.strip()} {' | '.join(tail)}"
            )
        return out.stdout

    def stop(self) -> None:
        """Stop the server the way a restart or maintenance window does (`pg_ctl -m fast`)."""
        self._pg("stop")

    def start(self) -> None:
        """Start it again (same data, same port)."""
        self._pg("start")

    def restart_with(self, setting: str) -> None:
        """Append a line to postgresql.conf and restart."""
        conf = self.state / "pgdata" / "postgresql.conf"
        conf.write_text(conf.read_text() + setting + "\n")
        self.stop()
        self.start()

    @classmethod
    def standby_of(cls, primary: ScratchCluster, port: int, slot: str, settings: Sequence[str] = ()) -> ScratchCluster:
        """A streaming physical standby of `primary`, from a cold copy of its data directory, started.

        The bundled majors have no pg_basebackup: `primary` is stopped for the copy and started
        again. `slot` is created on the primary as the standby's physical slot (primary_slot_name);
        the copy's own replication slots are left out, as pg_basebackup leaves them out, so the
        standby holds a logical slot only if it synchronizes it. `settings` are appended to the
        standby's postgresql.conf (e.g. `sync_replication_slots = on`). The primary_conninfo names
        a database, which slot synchronization needs.
        """
        with psycopg.connect(primary.dsn, autocommit=True) as c:
            c.execute("select pg_create_physical_replication_slot(%s, true)", (slot,))
        self = cls.__new__(cls)
        self.state = Path(tempfile.mkdtemp(prefix="changelake-scratch-", dir="/tmp"))
        self.state.chmod(0o755)
        self.env = dict(primary.env, CHANGELAKE_STATE=str(self.state), CHANGELAKE_PG_PORT=str(port))
        data = self.state / "pgdata"
        primary.stop()
        try:
            copy_data_dir(primary.state / "pgdata", data)
        finally:
            primary.start()
        for kept in (data / "pg_replslot").iterdir():
            shutil.rmtree(kept)
        (data / "standby.signal").touch()
        port_of_primary = primary.env["CHANGELAKE_PG_PORT"]
        conninfo = f"host=127.0.0.1 port={port_of_primary} user=changelake dbname=changelake application_name={slot}"
        conf = data / "postgresql.conf"
        lines = [
            f"port = {port}",
            f"unix_socket_directories = '{data}'",
            f"primary_conninfo = '{conninfo}'",
            f"primary_slot_name = '{slot}'",
            # the primary keeps the catalog rows a synchronized logical slot decodes with
            "hot_standby_feedback = on",
            *settings,
        ]
        conf.write_text(conf.read_text() + "\n".join(lines) + "\n")
        self.dsn = self._pg("start").strip().splitlines()[-1]
        return self

    def wait_replayed(self, upto: str, timeout_s: float = 30) -> None:
        """Until this standby has replayed WAL as far as `upto` (an LSN, e.g. the primary's flush position)."""
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(self.dsn, autocommit=True) as c:
            while True:
                done = c.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", (upto,)).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.dsn} did not replay WAL as far as {upto} in {timeout_s} s")
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a lost machine: no shutdown checkpoint, nothing more sent to standbys.

        Waits (up to 30 s) until the server no longer answers; its orphaned backends exit on their own.
        """
        pid = int((self.state / "pgdata" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=1).close()
            except psycopg.OperationalError:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.dsn} still answers after SIGKILL of its postmaster {pid}")
            time.sleep(0.1)

    def promote(self) -> None:
        """Promote a standby to a primary and wait (up to 60 s) until it accepts writes."""
        with psycopg.connect(self.dsn, autocommit=True) as c:
            row = c.execute("select pg_promote(true, 60)").fetchone()
        if row is None or row[0] is not True:
            raise RuntimeError(f"{self.dsn}: pg_promote did not finish within 60 s")

    def remove(self) -> None:
        """Stop the server and delete its files."""
        subprocess.run(["bash", str(ROOT / "scripts/pg.sh"), "stop"], env=self.env, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
