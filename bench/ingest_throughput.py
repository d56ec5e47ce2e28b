"""Benchmark: changelake-ingest `run --once` vs `pg_recvlogical` (pgoutput to /dev/null) on the same WAL.

Generates >= 1M row changes in a throwaway schema, with two slots created before the WAL: one for
pg_recvlogical (the baseline: the server's decoding plus a C client that writes nothing) and one
for changelake-ingest (decode, JSON, Arrow, Delta commits, positions). Prints both rates and the
ratio, the CPU time of each process, the peak RSS of ingest (and of any child process: there should
be none, ingest starts no JVM), and the time from process start to the first bronze commit. A
second part measures one single transaction of 1M rows (it must stream through in pages, not be
held whole): wall clock, time from process start to its last bronze commit, peak RSS, and what the
server did with it on ingest's slot (`pg_stat_replication_slots`, PostgreSQL 14+: spilled to its
disk, or streamed to ingest while decoding with pgoutput protocol 2).

`--pg-major N` runs it all on a throwaway cluster of that major (scripts/pg_versions.sh install N,
then scripts/pg.sh with CHANGELAKE_PG_BINDIR on a free port in 25500-25599; stopped and deleted at
the end); without it, the default cluster (CHANGELAKE_PG_DSN or scripts/pg.sh start: Debian's 15).
pg_recvlogical is always Debian's client, which speaks to every major. `--protocol 1` sets
`streaming: false` on ingest's source (pgoutput protocol 1, the server spills a large transaction);
`auto` is ingest's default (protocol 2 with streaming 'on' from PostgreSQL 14); `both` reads each
single transaction with both, from two slots, one run after the other (the stream part: `auto`), and
`--single-runs N` makes N single transactions, the order of the two alternating. `--parts` runs both
parts, or only the stream or the single transaction. `--startup-runs N` adds N runs of `run --once`
with nothing new to read: the start-up alone (imports, checks, bronze reads, the drain marker's
commit), median and spread, which the stream part's single start-up figure is too noisy to show.

Usage: .venv/bin/python bench/ingest_throughput.py [--rows 1000000] [--single-txn-rows 1000000]
       [--batch-events 100000] [--pg-major N] [--protocol auto|1|both] [--parts both|stream|single]
       [--single-runs N] [--startup-runs N]
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# Where `python -m ingest` runs (its working directory puts that tree's `ingest` package first):
# --ingest-tree, e.g. a worktree of an older commit for an A/B on the same venv; default this tree.
INGEST_TREE = ROOT
sys.path.insert(0, str(ROOT))

from tests.helpers.scratch_pg import ScratchCluster  # noqa: E402  (no pytest: psycopg and scripts/pg.sh)

# Ports for the throwaway cluster: below the kernel's ephemeral range (tests/helpers/scratch_pg.py),
# apart from the 253xx/254xx the tests use.
PORTS = range(25531, 25600)
# pg_stat_replication_slots (PostgreSQL 14+), the counters printed; total_txns tells a fresh report.
SLOT_STATS = ("spill_txns", "spill_count", "spill_bytes", "stream_txns", "stream_count", "stream_bytes", "total_txns")


def dsn() -> str:
    return (
        os.environ.get("CHANGELAKE_PG_DSN")
        or subprocess.run(
            ["bash", str(ROOT / "scripts/pg.sh"), "start"], check=True, capture_output=True, text=True
        ).stdout.split()[-1]
    )


def free_ports(count: int) -> list[int]:
    """The first `count` ports of PORTS nothing listens on (a cluster of another run may hold one),
    all different: each is held until the others are found."""
    held: list[socket.socket] = []
    try:
        for port in PORTS:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
            if len(held) == count:
                return [h.getsockname()[1] for h in held]
    finally:
        for h in held:
            h.close()
    raise SystemExit(f"no {count} free ports in {PORTS.start}-{PORTS.stop - 1} for the throwaway cluster")


def free_port() -> int:
    """The first port of PORTS nothing listens on."""
    return free_ports(1)[0]


@contextmanager
def server(major: int | None) -> Iterator[tuple[str, str]]:
    """The DSN to benchmark against and a description of the server's origin.

    None: the default cluster. A major: a throwaway cluster of it, stopped and deleted on exit.
    """
    if major is None:
        yield dsn(), "default cluster (CHANGELAKE_PG_DSN or scripts/pg.sh)"
        return
    subprocess.run(["bash", str(ROOT / "scripts/pg_versions.sh"), "install", str(major)], check=True)
    port = free_port()
    cluster = ScratchCluster(port, major)
    try:
        yield cluster.dsn, f"throwaway cluster, {cluster.env['CHANGELAKE_PG_BINDIR']}, port {port}"
    finally:
        cluster.remove()


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
    and the CPU time of each and of the walsender that serves it (last sample before exit).

    The walsender is the `active_pid` of `slot` on the benchmarked server (other clusters' and other
    clients' walsenders on this machine are not counted); without a slot, every walsender process.
    """

    def __init__(self, pid: int, dsn: str | None = None, slot: str | None = None) -> None:
        super().__init__(daemon=True)
        self.pid, self.py_peak, self.jvm_peak, self.stop = pid, 0, 0, False
        self.cpu: dict[str, dict[int, float]] = {"python": {}, "children": {}, "walsender": {}}
        self.slot_conn = psycopg.connect(dsn, autocommit=True) if dsn and slot else None
        self.slot = slot
        self.wal_before = {} if self.slot_conn else {p: cpu_seconds(p) for p in walsenders()}

    def slot_walsenders(self) -> list[int]:
        if self.slot_conn is None:
            return walsenders()
        row = self.slot_conn.execute(
            "select active_pid from pg_replication_slots where slot_name = %s", (self.slot,)
        ).fetchone()
        return [int(row[0])] if row and row[0] else []

    def run(self) -> None:
        try:
            while not self.stop:
                self.py_peak = max(self.py_peak, rss_kb(self.pid))
                kids = descendants(self.pid)
                self.jvm_peak = max([self.jvm_peak] + [rss_kb(k) for k in kids])
                for group, pids in (("python", [self.pid]), ("children", kids), ("walsender", self.slot_walsenders())):
                    for p in pids:
                        used = cpu_seconds(p) - (self.wal_before.get(p, 0.0) if group == "walsender" else 0.0)
                        self.cpu[group][p] = max(self.cpu[group].get(p, 0.0), used)
                time.sleep(0.2)
        finally:
            if self.slot_conn is not None:
                self.slot_conn.close()

    def cpu_total(self, group: str) -> float:
        return sum(self.cpu[group].values())

    def cpu_line(self, client: str = "python") -> str:
        total = {(client if g == "python" else g): sum(v.values()) for g, v in self.cpu.items() if v or g != "children"}
        return ", ".join(f"{g} {s:.1f} s" for g, s in total.items()) + f" (sum {sum(total.values()):.1f} s)"


def run_ingest(cfg: Path, dsn: str, slot: str) -> tuple[float, PeakRss, str, float]:
    """Run `run --once`; returns its wall time, peak RSS, log, and the wall-clock time it started."""
    started = time.time()
    t0 = time.monotonic()
    # BENCH_INGEST_PREFIX: a command to run ingest under (a profiler: `py-spy record -o FILE --`); its
    # figures then include the profiler's overhead, and RSS and CPU are the prefix process's.
    prefix = shlex.split(os.environ.get("BENCH_INGEST_PREFIX", ""))
    proc = subprocess.Popen(
        [*prefix, PY, "-m", "ingest", "-c", str(cfg), "-v", "run", "--once"],
        cwd=INGEST_TREE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = PeakRss(proc.pid, dsn, slot)
    peak.start()
    out, err = proc.communicate()
    secs = time.monotonic() - t0
    peak.stop = True
    peak.join()
    if proc.returncode != 0:
        raise SystemExit(f"ingest failed: {err[-3000:]}")
    if os.environ.get("BENCH_DEBUG"):
        print(err[-6000:])
    return secs, peak, err, started


def commit_seconds(log: str, started: float) -> list[float]:
    """Seconds from process start to each bronze commit (the timestamps of the `committed` log lines)."""
    stamps = []
    for line in log.splitlines():
        if "committed source=" in line:
            stamps.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() - started)
    return stamps


def startup_seconds(log: str, started: float) -> float | None:
    """Seconds from process start to the first bronze commit: Python imports, source checks, bronze
    tables, registration, the first batch (the timestamp of the first `committed` log line)."""
    stamps = commit_seconds(log, started)
    return stamps[0] if stamps else None


def slot_stats(conn: psycopg.Connection[Any], slot: str) -> dict[str, int] | None:
    """The slot's pg_stat_replication_slots counters; None before PostgreSQL 14 (no such view).

    A slot the server has not reported on yet has no row (14) or zeros: both read as zeros.
    """
    if conn.info.server_version < 140000:
        return None
    row = conn.execute(
        f"select {', '.join(SLOT_STATS)} from pg_stat_replication_slots where slot_name = %s", (slot,)
    ).fetchone()
    return {k: int(v or 0) for k, v in zip(SLOT_STATS, row or (0,) * len(SLOT_STATS), strict=True)}


def slot_stats_after(
    conn: psycopg.Connection[Any], slot: str, before: dict[str, int] | None, timeout_s: float = 5.0
) -> dict[str, int] | None:
    """The counters' growth since `before`, once the server has reported the run's transactions.

    The walsender reports a slot's counters as it decodes, and on 14 through the statistics collector
    (asynchronously): poll up to `timeout_s` until total_txns moved, then briefly once more so a
    report still in flight (the last transaction's) is counted.
    """
    if before is None:
        return None
    deadline = time.monotonic() + timeout_s
    now = slot_stats(conn, slot)
    while now is not None and now["total_txns"] == before["total_txns"] and time.monotonic() < deadline:
        time.sleep(0.1)
        now = slot_stats(conn, slot)
    time.sleep(0.3)
    now = slot_stats(conn, slot)
    assert now is not None
    return {k: now[k] - before[k] for k in SLOT_STATS}


def stats_line(stats: dict[str, int] | None) -> str:
    if stats is None:
        return "n/a (pg_stat_replication_slots needs PostgreSQL 14+)"
    return (
        f"spill_txns {stats['spill_txns']}, spill_count {stats['spill_count']}, "
        f"spill_bytes {stats['spill_bytes']:,} ({stats['spill_bytes'] / 2**20:.0f} MiB), "
        f"stream_txns {stats['stream_txns']}, stream_count {stats['stream_count']}, "
        f"stream_bytes {stats['stream_bytes']:,} ({stats['stream_bytes'] / 2**20:.0f} MiB), "
        f"total_txns {stats['total_txns']}"
    )


def mib(kb: int) -> str:
    return f"{kb / 1024:.0f} MiB"


@dataclass
class Summary:
    version: str = ""
    origin: str = ""
    protocol: str = ""
    recvlogical: str = ""
    lines: list[str] = field(default_factory=list)


def stream_part(
    conn: psycopg.Connection[Any], d: str, cfg: Path, schema: str, name: str, suffix: str, rows: int, out: Summary
) -> None:
    """1M changes in transactions of 10k: pg_recvlogical and ingest on the same WAL, each from its own slot."""
    base_slot = f"recv_{suffix}"
    conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (base_slot,))
    ingest_slot = f"changelake_{name}"
    recv_before, ingest_before = slot_stats(conn, base_slot), slot_stats(conn, ingest_slot)

    # The WAL: inserts, then updates and deletes, in transactions of 10k changes.
    t = time.monotonic()
    n_ins = rows // 2
    n_upd = rows * 3 // 10
    n_del = rows - n_ins - n_upd
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
    wal_mb = int(wal_bytes) / 1e6
    print(f"generated {rows:,} row changes, {wal_mb:.0f} MB of WAL, in {time.monotonic() - t:.0f} s")

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
    recv_cpu = PeakRss(recv_proc.pid, d, base_slot)
    recv_cpu.start()
    if recv_proc.wait() != 0:
        raise SystemExit(
            f"pg_recvlogical ({out.recvlogical}) failed ({recv_proc.returncode}) against PostgreSQL {out.version}: "
            "no baseline on this server"
        )
    recv_s = time.monotonic() - t
    recv_cpu.stop = True
    recv_cpu.join()
    recv_stats = slot_stats_after(conn, base_slot, recv_before)

    ingest_s, peak, log, started = run_ingest(cfg, d, ingest_slot)
    ingest_stats = slot_stats_after(conn, ingest_slot, ingest_before)
    warm = startup_seconds(log, started) or 0.0
    recv_rate = rows / recv_s
    rate = rows / ingest_s
    steady = rows / max(ingest_s - warm, 1e-9)
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
    print(f"peak RSS: python {mib(peak.py_peak)}, child processes {mib(peak.jvm_peak)}")
    recv_line = recv_cpu.cpu_line(client="pg_recvlogical")
    print(f"CPU time (2 cores), pg_recvlogical run: {recv_line}, over {recv_s:.1f} s of wall clock")
    print(f"CPU time (2 cores), ingest run: {peak.cpu_line()}, over {ingest_s:.1f} s of wall clock")
    print(f"slot stats, pg_recvlogical's slot {base_slot}: {stats_line(recv_stats)}")
    print(f"slot stats, ingest's slot {ingest_slot}: {stats_line(ingest_stats)}")
    conn.execute("select pg_drop_replication_slot(%s)", (base_slot,))
    out.lines.append(
        f"stream, {rows:,} changes in transactions of 10k ({wal_mb:.0f} MB of WAL):\n"
        f"| PostgreSQL | ingest protocol | pg_recvlogical | ingest `run --once` | **ratio (wall, incl. start-up)** "
        f"| excl. start-up | start-up to 1st commit | ingest CPU | walsender CPU (ingest run) | peak RSS |\n"
        f"|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {out.version} | {out.protocol} | {recv_s:.1f} s | {ingest_s:.1f} s | **{rate / recv_rate:.2f}** "
        f"| {steady / recv_rate:.2f} | {warm:.2f} s | {peak.cpu_total('python'):.1f} s "
        f"| {peak.cpu_total('walsender'):.1f} s | {mib(peak.py_peak)} |"
    )


def lsn_of(conn: psycopg.Connection[Any], expr: str) -> int:
    """The LSN `expr` gives, as a number."""
    return int(conn.execute(f"select {expr} - '0/0'::pg_lsn").fetchone()[0])  # type: ignore[index]


def log_running_xacts(conn: psycopg.Connection[Any]) -> None:
    """Have the server WAL-log its running transactions now (a logical slot's restart point).

    pg_log_standby_snapshot() from PostgreSQL 16, a CHECKPOINT (which logs them too) before.
    """
    if conn.info.server_version >= 160000:
        conn.execute("select pg_log_standby_snapshot()")
    else:
        conn.execute("checkpoint")


def single_part(
    conn: psycopg.Connection[Any],
    d: str,
    runs: list[tuple[str, Path, str]],
    schema: str,
    rows: int,
    out: Summary,
    first_id: int = 10_000_000,
    restart_point: bool = True,
) -> None:
    """One transaction of `rows` inserts, then `run --once` of each (protocol, config, source name) in
    `runs`, one after the other, each from its own slot; what the server did with it on each slot.

    `restart_point`: make each run start from a slot whose restart_lsn is past the earlier
    transactions. A protocol 2 slot keeps a restart_lsn at the start of the last transaction it
    streamed: a running-transactions record logged while that transaction ran makes the restart
    candidate, which applies only once ingest confirms past it, that is after the commit (ingest
    confirms no further than an open streamed transaction's start), and the records after the
    commit make no new candidate while that one waits. Its next run then decodes that
    transaction again from there, before the slot's confirmed position, where the server may not
    stream, so it spills it (the 134 MB of every second pair, BENCHMARKS.md) and the run waits for
    it. So: after the transaction the server logs its running transactions, and before each run
    the slot is advanced to its own confirmed position (pg_replication_slot_advance: the confirmed
    position stays; the server reads the WAL from restart_lsn without decoding changes, and moves
    restart_lsn to the last such record below it).
    """
    before = {name: slot_stats(conn, f"changelake_{name}") for _, _, name in runs}
    t = time.monotonic()
    txn_start = lsn_of(conn, "pg_current_wal_insert_lsn()")
    conn.execute(
        f"insert into {schema}.events select g, 1, 'one', 1, now() from generate_series(%s::bigint, %s::bigint) g",
        (first_id, first_id + rows - 1),
    )
    print(f"generated one transaction of {rows:,} inserts in {time.monotonic() - t:.0f} s")
    if restart_point:
        log_running_xacts(conn)
    if not out.lines or not out.lines[-1].startswith("single transaction"):
        out.lines.append(
            f"single transaction of {rows:,} inserts:\n"
            "| PostgreSQL | ingest protocol | `run --once` wall | **to committed bronze** | bronze commits "
            "| ingest CPU | walsender CPU | **peak RSS** | spill_txns | **spill_bytes** | stream_txns "
            "| stream_bytes |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
        )
    for protocol, cfg, name in runs:
        ingest_slot = f"changelake_{name}"
        if restart_point:
            conn.execute(
                "select pg_replication_slot_advance(slot_name, confirmed_flush_lsn) from pg_replication_slots "
                "where slot_name = %s",
                (ingest_slot,),
            )
        restart, confirmed = conn.execute(
            "select restart_lsn - '0/0'::pg_lsn, confirmed_flush_lsn - '0/0'::pg_lsn from pg_replication_slots "
            "where slot_name = %s",
            (ingest_slot,),
        ).fetchone() or (None, None)
        print(
            f"slot {ingest_slot} before its run: restart_lsn {(int(restart) - txn_start) / 1e6:+.1f} MB, "
            f"confirmed_flush_lsn {(int(confirmed) - txn_start) / 1e6:+.1f} MB from the transaction's start"
        )
        secs, peak, log, started = run_ingest(cfg, d, ingest_slot)
        stats = slot_stats_after(conn, ingest_slot, before[name])
        commits = commit_seconds(log, started)
        done = commits[-1] if commits else float("nan")
        first = commits[0] if commits else float("nan")
        print(
            f"single transaction of {rows:,} rows, protocol {protocol}: {secs:.1f} s wall clock, committed bronze "
            f"{done:.1f} s after process start ({len(commits)} commits, the first at {first:.1f} s), peak RSS "
            f"python {mib(peak.py_peak)}, child processes {mib(peak.jvm_peak)}"
        )
        print(f"CPU time (2 cores), ingest run: {peak.cpu_line()}, over {secs:.1f} s of wall clock")
        print(f"slot stats, ingest's slot {ingest_slot}: {stats_line(stats)}")

        def cell(key: str, stats: dict[str, int] | None = stats) -> str:
            return "n/a" if stats is None else f"{stats[key]:,}"

        out.lines[-1] += (
            f"\n| {out.version} | {protocol} | {secs:.1f} s | **{done:.1f} s** | {len(commits)} "
            f"| {peak.cpu_total('python'):.1f} s | {peak.cpu_total('walsender'):.1f} s | **{mib(peak.py_peak)}** "
            f"| {cell('spill_txns')} | **{cell('spill_bytes')}** | {cell('stream_txns')} | {cell('stream_bytes')} |"
        )


def startup_part(d: str, cfg: Path, name: str, runs: int, out: Summary) -> None:
    """`run --once` `runs` times on the source with nothing new: start-up alone, and the spread of it.

    Each run still writes: the drain marker's transaction and the raised position are its first
    (and only) bronze commit, so "to 1st commit" is the start-up of the stream part without its
    first batch's decoding.
    """
    walls, firsts, cpus = [], [], []
    for _ in range(runs):
        secs, peak, log, started = run_ingest(cfg, d, f"changelake_{name}")
        walls.append(secs)
        firsts.append(startup_seconds(log, started) or float("nan"))
        cpus.append(peak.cpu_total("python"))
    print(
        f"start-up alone, {runs} runs of run --once with nothing new: wall "
        + " / ".join(f"{w:.2f}" for w in walls)
        + " s; to the first commit "
        + " / ".join(f"{f:.2f}" for f in firsts)
        + " s"
    )

    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f})"

    out.lines.append(
        f"start-up alone ({runs} runs of `run --once` with nothing new; median (min-max)):\n"
        f"| PostgreSQL | ingest protocol | `run --once` wall | **to 1st commit** | ingest CPU |\n"
        f"|---|---|---|---|---|\n"
        f"| {out.version} | {out.protocol} | {spread(walls)} | **{spread(firsts)}** | {spread(cpus)} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--single-txn-rows", type=int, default=1_000_000)
    ap.add_argument("--batch-events", type=int, default=100_000, help="ingest's batch.max_events")
    ap.add_argument(
        "--pg-major",
        type=int,
        help="run on a throwaway cluster of this PostgreSQL major (scripts/pg_versions.sh); "
        "default: the default cluster (CHANGELAKE_PG_DSN or scripts/pg.sh start)",
    )
    ap.add_argument(
        "--protocol",
        choices=["auto", "1", "both"],
        default="auto",
        help="auto: ingest's default (pgoutput 2 with streaming 'on' from PostgreSQL 14); 1: `streaming: false`; "
        "both: the single transaction read by each, from two slots, in the same run (the stream part: auto)",
    )
    ap.add_argument(
        "--single-runs",
        type=int,
        default=1,
        metavar="N",
        help="the single transaction N times (with --protocol both: each time by both, the order alternating)",
    )
    ap.add_argument("--parts", choices=["both", "stream", "single"], default="both")
    ap.add_argument(
        "--startup-runs",
        type=int,
        default=0,
        metavar="N",
        help="after the parts, N runs of `run --once` with nothing new: start-up alone (default 0: none)",
    )
    ap.add_argument(
        "--no-restart-point",
        action="store_true",
        help="leave the slots' restart_lsn where the runs left it (the bench before 2026-11-27: a protocol 2 slot's "
        "next run decodes the previous streamed transaction again and spills it)",
    )
    ap.add_argument(
        "--ingest-tree",
        type=Path,
        default=ROOT,
        help="run `python -m ingest` from this tree (e.g. a git worktree of another commit; same venv, so the "
        "installed native decoder: check the old code accepts it); default: this script's tree",
    )
    args = ap.parse_args()
    global INGEST_TREE
    INGEST_TREE = args.ingest_tree.resolve()
    load = os.getloadavg()
    command = " ".join([".venv/bin/python", "bench/ingest_throughput.py", *map(shlex.quote, sys.argv[1:])])
    recv = shutil.which("pg_recvlogical") or str(next(Path("/usr/lib/postgresql").glob("*/bin/pg_recvlogical")))
    with server(args.pg_major) as (d, origin):
        out = Summary(origin=origin)
        out.recvlogical = subprocess.run([recv, "--version"], capture_output=True, text=True).stdout.strip()
        suffix = secrets.token_hex(3)
        schema, name = f"bench_{suffix}", f"bench_{suffix}"
        work = Path(tempfile.mkdtemp(prefix="changelake-bench-"))
        conn = psycopg.connect(d, autocommit=True)
        try:
            out.version = str(conn.execute("show server_version").fetchone()[0])  # type: ignore[index]
            work_mem = conn.execute("show logical_decoding_work_mem").fetchone()[0]  # type: ignore[index]
            streams = args.protocol != "1" and conn.info.server_version >= 140000
            out.protocol = "2, streaming on" if streams else "1"
            print(f"server: PostgreSQL {out.version} ({origin}); logical_decoding_work_mem {work_mem}")
            print(f"baseline client: {out.recvlogical}")
            print(f"ingest: pgoutput protocol {out.protocol} (--protocol {args.protocol})")
            conn.execute(f"create schema {schema}")
            conn.execute(
                f"create table {schema}.events (id bigint primary key, account int, kind text, "
                "amount numeric(12,2), at timestamptz)"
            )
            source: dict[str, Any] = {
                "kind": "postgres",
                "name": name,
                "dsn": d,
                "tables": [f"{schema}.events"],
                # The stream alone, as pg_recvlogical reads it: no initial table snapshot
                # (bench/snapshot_lag.py measures snapshots beside the stream).
                "snapshot": {"initial": False},
            }
            if args.protocol == "1":
                source["streaming"] = False

            def config(path: Path, source: dict[str, Any]) -> Path:
                path.write_text(
                    yaml.safe_dump(
                        {
                            "warehouse": str(work / "warehouse"),
                            "batch": {"max_events": args.batch_events, "max_seconds": 10},
                            "sources": [source],
                        }
                    )
                )
                subprocess.run(
                    [PY, "-m", "ingest", "-c", str(path), "setup"], cwd=INGEST_TREE, check=True, capture_output=True
                )
                return path

            cfg = config(work / "ingest.yml", source)
            if args.parts in ("both", "stream") and args.rows:
                stream_part(conn, d, cfg, schema, name, suffix, args.rows, out)
            single = [(out.protocol, cfg, name)]
            if args.protocol == "both":  # protocol 1 from a slot of its own (made now), on the same transactions
                name1 = f"bench1_{suffix}"
                cfg1 = config(work / "ingest-p1.yml", {**source, "name": name1, "streaming": False})
                single.append(("1", cfg1, name1))
            if args.parts in ("both", "single") and args.single_txn_rows:
                for i in range(args.single_runs):
                    order = single if i % 2 == 0 else single[::-1]
                    single_part(
                        conn,
                        d,
                        order,
                        schema,
                        args.single_txn_rows,
                        out,
                        10_000_000 * (i + 1),
                        restart_point=not args.no_restart_point,
                    )
            if args.startup_runs:
                startup_part(d, cfg, name, args.startup_runs, out)
        finally:
            with psycopg.connect(d, autocommit=True) as c:
                for (slot,) in c.execute(
                    "select slot_name from pg_replication_slots where slot_name like %s", (f"%{suffix}",)
                ).fetchall():
                    c.execute("select pg_drop_replication_slot(%s)", (slot,))
                c.execute(f"drop publication if exists changelake_{name}")
                c.execute(f"drop publication if exists changelake_bench1_{suffix}")
                c.execute(f"drop schema if exists {schema} cascade")
            conn.close()
            shutil.rmtree(work, ignore_errors=True)

    print()
    print("=== summary (for BENCHMARKS.md) ===")
    print(f"command: {command}")
    print(
        f"date: {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; load average at the start "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min)"
    )
    print(f"server: PostgreSQL {out.version} ({out.origin}); baseline: {out.recvlogical} (proto_version=1)")
    print(f"ingest: pgoutput protocol {out.protocol}, batch.max_events {args.batch_events:,}")
    if INGEST_TREE != ROOT:
        print(f"ingest tree: {INGEST_TREE}")
    for block in out.lines:
        print(block)


if __name__ == "__main__":
    main()
