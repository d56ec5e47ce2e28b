"""The resource that runs the two halves of a changelake round as the scheduled job does."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource

# changelake-ingest's exit codes (docs/operations.md): 75 is sysexits' EX_TEMPFAIL, a source or the
# warehouse is unavailable and the same command later will carry on where this one stopped.
EXIT_OK = 0
EXIT_TEMPFAIL = 75
# ops/scheduled_job.sh with CHANGELAKE_JOB_INGEST=0: ingest committed nothing silver would load.
EXIT_NOTHING_TO_BUILD = 3
# `status --json` exits with the worst source state (3 lagging, 4 stale, 5 lost or unreachable) and
# still prints its document; 1 and 2 print no document.
STATUS_DOCUMENT_EXITS = frozenset({0, 3, 4, 5})
# What a failed step shows of a command's stderr: the one-line error is the last line.
STDERR_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class Finished:
    """One command's outcome: its exit code and its output."""

    exit_code: int
    stdout: str
    stderr: str

    def tail(self) -> str:
        """The end of stderr, where changelake prints its one-line error."""
        return "\n".join(self.stderr.strip().splitlines()[-STDERR_TAIL_LINES:])


class ChangelakeRound(ConfigurableResource["ChangelakeRound"]):
    """Where the project is and how to run it.

    Responsibilities: run `changelake-ingest run --once`, the dbt half of ops/scheduled_job.sh and
    `status --json` with the project's virtualenv first on PATH and the same config and warehouse
    for all three, so ingest and dbt see one bronze.
    """

    project_dir: str
    """The changelake checkout (its .venv holds changelake-ingest and dbt)."""
    config: str
    """ingest's YAML config (CHANGELAKE_CONFIG)."""
    warehouse: str
    """The warehouse both halves use (CHANGELAKE_WAREHOUSE)."""
    dbt_args: str = ""
    """CHANGELAKE_DBT_ARGS (empty: the job's `build --exclude-resource-type unit_test`)."""
    retries: int = 5
    """How often an unavailable source or warehouse (exit 75) is retried before the step fails."""
    retry_wait_seconds: float = 300.0
    """Seconds between those retries: an outage usually outlasts a few seconds."""
    command_timeout_seconds: float = 3600.0
    """A command running longer is stopped and the step fails (a hung round must not block the next)."""
    extra_env: dict[str, str] = {}
    """More environment for both halves (DBT_TARGET, DBT_PROFILES_DIR, DBT_TARGET_PATH ...)."""

    def _env(self, **more: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        venv_bin = str(Path(self.project_dir) / ".venv" / "bin")
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
        env["CHANGELAKE_CONFIG"] = self.config
        env["CHANGELAKE_WAREHOUSE"] = self.warehouse
        env.update(more)
        return env

    def _run(self, argv: list[str], env: dict[str, str]) -> Finished:
        r = subprocess.run(
            argv,
            cwd=self.project_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=self.command_timeout_seconds,
            check=False,
        )
        return Finished(r.returncode, r.stdout, r.stderr)

    def ingest_once(self) -> Finished:
        """`changelake-ingest run --once`: every source up to its position at the start."""
        return self._run(["changelake-ingest", "-c", self.config, "run", "--once"], self._env())

    def build(self) -> Finished:
        """The dbt half of ops/scheduled_job.sh (it skips dbt when bronze holds nothing new)."""
        more = {"CHANGELAKE_JOB_INGEST": "0"}
        if self.dbt_args:
            more["CHANGELAKE_DBT_ARGS"] = self.dbt_args
        return self._run(["bash", "ops/scheduled_job.sh"], self._env(**more))

    def status(self) -> dict[str, Any]:
        """`status --json` (docs/operations.md); raises when the command printed no document."""
        done = self._run(["changelake-ingest", "-c", self.config, "status", "--json"], self._env())
        if done.exit_code not in STATUS_DOCUMENT_EXITS:
            raise RuntimeError(f"changelake-ingest status --json exited {done.exit_code}: {done.tail()}")
        doc: dict[str, Any] = json.loads(done.stdout)
        return doc
