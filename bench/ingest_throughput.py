"""Benchmark: changelake-ingest `run --once` vs `pg_recvlogical` (pgoutput to /dev/null) on the same WAL.

Generates >= 1M row changes in a throwaway schema, with two slots created before the WAL: one for
pg_recvlogical (the baseline: the server's decoding plus a C client that writes nothing) and one
for changelake-ingest (decode, JSON, Arrow, Delta commits, positions). Prints both rates and the
ratio, the CPU time of each process, the peak RSS of ingest (and of any child process: there should
be none, ingest starts no JVM), and the time from process start to the first bronze commit. A
second part measures one single transaction of 1M rows (it must stream through in pages, not be
held whole).

Usage: .venv/bin/python bench/ingest_throughput.py [--rows 1000000] [--single-txn-rows 1000000]
       [--batch-events 100000]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def dsn() -> str:
    return (
        os.environ.get("CHANGELAKE_PG_DSN")
        or subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout.split()[-1]
    )


def rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout.split()
    kids = [int(p) for p in out]
    return kids + [g for k in kids for g in descendants(k)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def walsenders() -> list[int]:
    """PostgreSQL walsender processes (they decode the WAL for a replication connection)."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "walsender" in line]


class PeakRss(threading.Thread):
    """Samples the RSS of a process (python) and, separately, the largest of its descendants (none expected),
    and the CPU time of each and of the walsenders that run meanwhile (last sample before exit)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.py_peak, self.jvm_peak, self.stop = pid, 0, 0, False
        self.cpu: dict[str, dict[int, float]] = {"python": {}, "children": {}, "walsender": {}}
        self.wal_before = {p: cpu_seconds(p) for p in walsenders()}

    def run(self) -> None:
        while not self.stop:
            self.py_peak = max(self.py_peak, rss_kb(self.pid))
            kids = descendants(self.pid)
            self.jvm_peak = max([self.jvm_peak] + [rss_kb(k) for k in kids])
            for group, pids in (("python", [self.pid]), ("children", kids), ("walsender", walsenders())):
                for p in pids:
                    used = cpu_seconds(p) - (self.wal_before.get(p, 0.0) if group == "walsender" else 0.0)
                    self.cpu[group][p] = max(self.cpu[group].get(p, 0.0), used)
            time.sleep(0.2)

    def cpu_line(self, client: str = "python") -> str:
        total = {(client if g == "python" else g): sum(v.values()) for g, v in self.cpu.items() if v or g != "children"}
        return ", ".join(f"{g} {s:.1f} s" for g, s in total.items()) + f" (sum {sum(total.values()):.1f} s)"


def run_ingest(cfg: Path) -> tuple[float, PeakRss, str, float]:
    """Run `run --once`; returns its wall time, peak RSS, log, and the wall-clock time it started."""
    started = time.time()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [PY, "-m", "ingest", "-c", str(cfg), "-v", "run", "--once"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = PeakRss(proc.pid)
    peak.start()
    out, err = proc.communicate()
    peak.stop = True
    secs = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed: {err[-3000:]}")
    if os.environ.get("BENCH_DEBUG"):
        print(err[-6000:])
    return secs, peak, err, started


def startup_seconds(log: str, started: float) -> float | None:
    """Seconds from process start to the first bronze commit: Python imports, source checks, bronze
    tables, registration, the first batch (the timestamp of the first `committed` log line)."""
    for line in log.splitlines():
        if "committed source=" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp() - started
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--single-txn-rows", type=int, default=1_000_000)
    ap.add_argument("--batch-events", type=int, default=100_000, help="ingest's batch.max_events")
    args = ap.parse_args()
    d = dsn()
    suffix = secrets.token_hex(3)
    schema, name = f"bench_{suffix}", f"bench_{suffix}"
    work = Path(tempfile.mkdtemp(prefix="changelake-bench-"))
    conn = psycopg.connect(d, autocommit=True)
    try:
        conn.execute(f"create schema {schema}")
        conn.execute(
            f"create table {schema}.events (id bigint primary key, account int, kind text, "
            "amount numeric(12,2), at timestamptz)"
        )
        cfg = work / "ingest.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "warehouse": str(work / "warehouse"),
                    "batch": {"max_events": args.batch_events, "max_seconds": 10},
                    "sources": [
                        {
                            "kind": "postgres",
                            "name": name,
                            "dsn": d,
                            "tables": [f"{schema}.events"],
                            # The stream alone, as pg_recvlogical reads it: no initial table snapshot
                            # (bench/snapshot_lag.py measures snapshots beside the stream).
                            "snapshot": {"initial": False},
                        }
                    ],
                }
            )
        )
        subprocess.run([PY, "-m", "ingest", "-c", str(cfg), "setup"], cwd=ROOT, check=True, capture_output=True)
        base_slot = f"recv_{suffix}"
        conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (base_slot,))

        # The WAL: inserts, then updates and deletes, in transactions of 10k changes.
        t = time.monotonic()
        n_ins = args.rows // 2
        n_upd = args.rows * 3 // 10
        n_del = args.rows - n_ins - n_upd
        step = 10_000
        for lo in range(1, n_ins + 1, step):
            conn.execute(
                f"insert into {schema}.events select g, g %% 1000, 'k' || (g %% 7), g * 0.01, now() "
                "from generate_series(%s::bigint, %s::bigint) g",
                (lo, min(lo + step - 1, n_ins)),
            )
        for lo in range(1, n_upd + 1, step):
            conn.execute(
                f"update {schema}.events set amount = amount + 1, kind = 'u' where id between %s and %s",
                (lo, min(lo + step - 1, n_upd)),
            )
        for lo in range(n_ins - n_del + 1, n_ins + 1, step):
            conn.execute(f"delete from {schema}.events where id between %s and %s", (lo, min(lo + step - 1, n_ins)))
        end_lsn = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
        wal_bytes = conn.execute(
            "select pg_wal_lsn_diff(%s::pg_lsn, confirmed_flush_lsn) from pg_replication_slots where slot_name = %s",
            (end_lsn, base_slot),
        ).fetchone()[0]  # type: ignore[index]
        print(
            f"generated {args.rows:,} row changes, {int(wal_bytes) / 1e6:.0f} MB of WAL, "
            f"in {time.monotonic() - t:.0f} s"
        )

        recv = shutil.which("pg_recvlogical") or next(Path("/usr/lib/postgresql").glob("*/bin/pg_recvlogical"))
        t = time.monotonic()
        recv_proc = subprocess.Popen(
            [
                str(recv),
                "-d",
                d,
                "--slot",
                base_slot,
                "--start",
                "--endpos",
                end_lsn,
                "--no-loop",
                "-o",
                "proto_version=1",
                "-o",
                f"publication_names=changelake_{name}",
                "-f",
                "/dev/null",
            ],
        )
        recv_cpu = PeakRss(recv_proc.pid)
        recv_cpu.start()
        if recv_proc.wait() != 0:
            raise SystemExit(f"pg_recvlogical failed ({recv_proc.returncode})")
        recv_s = time.monotonic() - t
        recv_cpu.stop = True

        ingest_s, peak, log, started = run_ingest(cfg)
        warm = startup_seconds(log, started) or 0.0
        recv_rate = args.rows / recv_s
        rate = args.rows / ingest_s
        steady = args.rows / max(ingest_s - warm, 1e-9)
        print(f"pg_recvlogical (pgoutput -> /dev/null): {recv_s:6.1f} s  {recv_rate:9,.0f} changes/s")
        print(
            f"changelake-ingest run --once:          {ingest_s:6.1f} s  {rate:9,.0f} changes/s "
            f"(start-up to the first commit: {warm:.2f} s)"
        )
        print(f"  excluding start-up:                   {ingest_s - warm:6.1f} s  {steady:9,.0f} changes/s")
        print(
            f"ratio ingest / pg_recvlogical: {rate / recv_rate:.2f} (wall clock), "
            f"{steady / recv_rate:.2f} (excluding start-up)"
        )
        print(f"peak RSS: python {peak.py_peak / 1024:.0f} MiB, child processes {peak.jvm_peak / 1024:.0f} MiB")
        recv_line = recv_cpu.cpu_line(client="pg_recvlogical")
        print(f"CPU time (2 cores), pg_recvlogical run: {recv_line}, over {recv_s:.1f} s of wall clock")
        print(f"CPU time (2 cores), ingest run: {peak.cpu_line()}, over {ingest_s:.1f} s of wall clock")
        conn.execute("select pg_drop_replication_slot(%s)", (base_slot,))

        if args.single_txn_rows:
            conn.execute(
                f"insert into {schema}.events select g, 1, 'one', 1, now() "
                "from generate_series(%s::bigint, %s::bigint) g",
                (10_000_000, 10_000_000 + args.single_txn_rows - 1),
            )
            secs, peak, _, _ = run_ingest(cfg)
            print(
                f"single transaction of {args.single_txn_rows:,} rows: {secs:.1f} s, peak RSS python "
                f"{peak.py_peak / 1024:.0f} MiB, child processes {peak.jvm_peak / 1024:.0f} MiB"
            )
    finally:
        with psycopg.connect(d, autocommit=True) as c:
            for (slot,) in c.execute(
                "select slot_name from pg_replication_slots where slot_name like %s", (f"%{suffix}",)
            ).fetchall():
                c.execute("select pg_drop_replication_slot(%s)", (slot,))
            c.execute(f"drop publication if exists changelake_{name}")
            c.execute(f"drop schema if exists {schema} cascade")
        conn.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
