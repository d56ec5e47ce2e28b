"""A throwaway PostgreSQL cluster that a test may stop, restart and misconfigure (scripts/pg.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pg_bindir(major: int) -> str:
    """The bin directory of PostgreSQL `major` (scripts/pg_versions.sh); a clear error when not installed."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/pg_versions.sh"), "bindir", str(major)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return out.stdout.strip()


def copy_data_dir(src: Path, dst: Path) -> None:
    """A cold copy of a stopped cluster's data directory (what a storage snapshot restores), replacing `dst`."""
    if dst.exists():
        shutil.rmtree(dst)
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


class ScratchCluster:
    """Owns one cluster in a temporary state directory on its own port; `remove()` deletes it."""

    def __init__(self, port: int, major: int | None = None) -> None:
        """Create and start the cluster (initdb on first start, `wal_level = logical`).

        `major` picks a PostgreSQL major of scripts/pg_versions.sh (its binaries must be installed:
        `make setup`); None is the Debian one scripts/pg.sh installs.
        """
        self.state = Path(tempfile.mkdtemp(prefix="changelake-scratch-", dir="/tmp"))
        self.state.chmod(0o755)
        self.env = dict(os.environ, CHANGELAKE_STATE=str(self.state), CHANGELAKE_PG_PORT=str(port))
        if major is not None:
            self.env["CHANGELAKE_PG_BINDIR"] = pg_bindir(major)
        self.dsn = self._pg("start").strip().splitlines()[-1]

    def _pg(self, command: str) -> str:
        out = subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), command], env=self.env, check=True, capture_output=True, text=True
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

    def remove(self) -> None:
        """Stop the server and delete its files."""
        subprocess.run(["bash", str(ROOT / "scripts/pg.sh"), "stop"], env=self.env, check=False)
        shutil.rmtree(self.state, ignore_errors=True)
