"""Benchmark: silver freshness in the continuous mode, source commit to the row visible in consumer_records.

What runs, as a user runs it: a source table of --rows rows (100k) under a steady --rate (2k) row
changes per second (bench/snapshot_lag.py's `load`: 20-row updates from their own process), and
`ops/continuous.sh` with CHANGELAKE_CONFIG naming a bench config (both tables in one source, one
publication; no initial snapshot, as in bench/freshness.py: the load touches ~70% of the keys in
the first minute, so consumer_records holds most of the table within the warm-up anyway),
CHANGELAKE_WAREHOUSE a temporary warehouse and the default dbt arguments (CHANGELAKE_DBT_ARGS unset:
`build --exclude-resource-type unit_test`, what the continuous mode runs out of the box; --dbt-args
sets it, e.g. to the `run --select silver` docs/operations.md suggests for the freshest silver).
The script starts its own warm engine (scripts/cluster.sh, the local Thrift server) on free ports
with its state in the work directory; dbt's target/ and logs/ go there too.

The probe: every --probe-interval seconds (0.5) one row is inserted into a small second table of the
same source (`probes`, insert-only, autocommit). Its commit time is the prober's clock right after
the commit returns (this machine's clock, as every other time here; a few ms after the true commit,
so freshness is understated by at most that). The source's own commit time, which consumer_records
carries as `updated_at`, is compared with it at the end as a check.

Visibility: a poller reads consumer_records with delta-rs (deltalake.DeltaTable at
<warehouse>/dbt/silver.db/consumer_records; its DataFusion reader honours the table's deletion
vectors) every --poll-interval seconds (0.5) and records, per probe key, the clock after the first
read that returned it live, and the table version it read. Freshness = first seen - probe commit:
what a reader polling the table sees (an upper bound by at most one poll interval plus a read).
The Delta commit timestamp of that version (commitInfo, the engine's clock) minus the probe commit
is printed beside it: the same figure without the poller's resolution.

Warm-up and window: the engine start and the first --warmup-rounds successful dbt rounds (1: the
first full build) are not measured. The window is the --seconds (600: five rounds of the ~110 s a
round took in a development run) after the end of the last warm-up round; every probe committed in
it counts. The load and the probes go on until each window
probe is seen (or --drain-timeout seconds after the window; a probe never seen counts as infinitely
late, so a percentile it reaches prints as "> the time waited"). Rounds that end in the window are
listed with the script's own "silver built in Ns" and, from each round's run_results.json (copied
as the round ends), dbt's elapsed time, the models' and tests' summed node times, the slowest nodes
and when consumer_records' MERGE completed within the round.

The goal is absolute (p50 <= 30 s, p95 <= 60 s at 2k changes/s), like bench/freshness.py:
no other tool keeps this silver in the same run to compare with. Hold the heavy and pg locks and
run it alone: the machine's two cores are shared by PostgreSQL, the load, ingest, the engine, dbt and
the poller, as they would be on a one-machine deployment.

Quiet: ops/continuous.sh's output (ingest, dbt, the engine's start) goes, time-stamped, to
<workdir>/continuous.log; the bench prints progress lines and the result. On exit (error or not) the
script gets SIGTERM, whatever is left in its process group is killed and reported, and
`scripts/cluster.sh down` runs for its state; the warehouse is removed unless --keep, the log and the
rounds' run_results stay in the work directory.

Usage: .venv/bin/python bench/silver_freshness.py [--seconds 600] [--rate 2000] [--rows 100000]
    [--probe-interval 0.5] [--warmup-rounds 1] [--drain-timeout 300] [--dbt-args ARGS] [--workdir DIR] [--keep]
       .venv/bin/python bench/silver_freshness.py --report WORKDIR   (the result again, from raw.json)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import yaml
from deltalake import DeltaTable, QueryBuilder
from deltalake.exceptions import TableNotFoundError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ingest_throughput import free_ports  # noqa: E402
from bench.snapshot_lag import create_items, dsn, load, quantile  # noqa: E402

GOAL_P50_S, GOAL_P95_S = 30.0, 60.0
WARMUP_TIMEOUT_S = 1200.0  # the engine's start and the first full build under load on 2 cores
STOP_TIMEOUT_S = 180.0
BUILT = "continuous: silver built in "
FAILED = "continuous: dbt round failed"


def iso(ts: str) -> float:
    """dbt's timing stamps (UTC, ISO, with or without a Z) as epoch seconds."""
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass
class Round:
    """One successful dbt round of ops/continuous.sh: when its line came, what it took, where the time went."""

    ended: float  # the bench's clock when "silver built in Ns" was read
    wall_s: int  # N, the script's own count
    results: dict[str, Any] | None = None  # its run_results.json


@dataclass
class Shared:
    """What the prober, the poller and the log reader record, read by the main thread."""

    commits: dict[int, float] = field(default_factory=dict)  # probe id -> commit (clock after commit)
    seen: dict[int, tuple[float, int]] = field(default_factory=dict)  # probe id -> (first seen, version)
    rounds: list[Round] = field(default_factory=list)
    failed_rounds: list[float] = field(default_factory=list)
    poll_errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def probe(d: str, table: str, interval: float, sh: Shared) -> None:
    """Insert probe rows 1, 2, ... every `interval` seconds, each in its own transaction."""
    with psycopg.connect(d, autocommit=True) as c:
        n, t0 = 0, time.monotonic()
        while not sh.stop.is_set():
            n += 1
            c.execute(f"insert into {table} (id) values (%s)", (n,))
            sh.commits[n] = time.time()
            ahead = n * interval - (time.monotonic() - t0)
            if ahead > 0:
                sh.stop.wait(ahead)


def poll(path: Path, source: str, interval: float, sh: Shared) -> None:
    """Read consumer_records' live probe keys every `interval` seconds; note each key's first sighting."""
    sql = f"select record_pk from t where source = '{source}' and table_name = 'probes' and not deleted"
    dt: DeltaTable | None = None
    while not sh.stop.wait(interval):
        try:
            if dt is None:
                dt = DeltaTable(str(path))
            else:
                dt.update_incremental()
            keys = QueryBuilder().register("t", dt).execute(sql).read_all().column("record_pk").to_pylist()
        except TableNotFoundError:
            continue  # the first build has not created it yet
        except Exception as e:  # a read that failed is reported with the result, never hidden
            sh.poll_errors.append(f"{type(e).__name__}: {e}")
            dt = None
            continue
        now, version = time.time(), dt.version()
        for pk in keys:
            sh.seen.setdefault(int(json.loads(pk)["id"]), (now, version))


def read_log(proc: subprocess.Popen[str], log: Path, target: Path, keep: Path, sh: Shared) -> None:
    """Copy the script's output to `log`, time-stamped; note each round's end and keep its run_results."""
    assert proc.stdout is not None
    with log.open("w") as out:
        for line in proc.stdout:
            now = time.time()
            out.write(f"{now:.3f} {line}")
            out.flush()
            if line.startswith(BUILT):
                r = Round(now, int(line[len(BUILT) :].strip().rstrip("s")))
                try:  # the round's dbt has exited: its run_results.json is whole
                    text = (target / "run_results.json").read_text()
                    r.results = json.loads(text)
                    (keep / f"round_{len(sh.rounds) + 1}.json").write_text(text)
                except (OSError, ValueError):
                    pass
                sh.rounds.append(r)
            elif line.startswith(FAILED):
                sh.failed_rounds.append(now)


def fmt(x: float, waited: float) -> str:
    return f"> {waited:.0f} s (not seen)" if x == float("inf") else f"{x:.1f} s"


def round_summary(r: Round, started: float | None) -> dict[str, Any]:
    """A round's figures: wall, dbt elapsed, models and tests (summed node times), consumer_records' commit."""
    out: dict[str, Any] = {"wall_s": r.wall_s}
    if r.results is None:
        return out
    res = r.results["results"]
    out["dbt_elapsed_s"] = r.results.get("elapsed_time", 0.0)
    out["models_s"] = sum(n["execution_time"] for n in res if n["unique_id"].startswith("model."))
    out["tests_s"] = sum(n["execution_time"] for n in res if n["unique_id"].startswith("test."))
    out["nodes"] = {n["unique_id"].split(".")[2]: n["execution_time"] for n in res}
    out["statuses"] = {s: sum(1 for n in res if n["status"] == s) for s in {n["status"] for n in res}}
    cr = [n for n in res if n["unique_id"].endswith(".consumer_records")]
    done = [t["completed_at"] for n in cr for t in n.get("timing", []) if t["name"] == "execute" and t["completed_at"]]
    if done and started is not None:
        out["consumer_records_committed_at_s"] = iso(done[0]) - started
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="the measured window, after the warm-up")
    ap.add_argument("--rate", type=int, default=2000, help="row changes per second on the source table")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--probe-interval", type=float, default=0.5)
    ap.add_argument("--poll-interval", type=float, default=0.5)
    ap.add_argument("--warmup-rounds", type=int, default=1, help="successful dbt rounds left out (1: the first build)")
    ap.add_argument("--drain-timeout", type=float, default=300.0)
    ap.add_argument(
        "--dbt-args",
        help="CHANGELAKE_DBT_ARGS for the rounds (e.g. 'run --select silver', which docs/operations.md suggests "
        "for the freshest silver); default: unset, the continuous mode's own `build --exclude-resource-type unit_test`",
    )
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--keep", action="store_true", help="keep the warehouse too")
    args = ap.parse_args()

    d = dsn()
    sfx = secrets.token_hex(3)
    schema = name = f"bench_sfresh_{sfx}"
    work = args.workdir or Path(tempfile.mkdtemp(prefix="changelake-silver-fresh-"))
    work.mkdir(parents=True, exist_ok=True)
    wh, state, target, kept = work / "warehouse", work / "state", work / "dbt-target", work / "run_results"
    kept.mkdir(exist_ok=True)
    # Two different ports: free_port() twice gives the same one (the first free of a range), and a
    # Thrift server whose UI takes its port never serves (the warm-up then fails, "TSocket read 0 bytes").
    thrift_port, ui_port = free_ports(2)
    env = dict(
        os.environ,
        CHANGELAKE_CONFIG=str(work / "ingest.yml"),
        CHANGELAKE_WAREHOUSE=str(wh),
        CHANGELAKE_STATE=str(state),
        CHANGELAKE_THRIFT_PORT=str(thrift_port),
        CHANGELAKE_THRIFT_UI_PORT=str(ui_port),
        DBT_TARGET_PATH=str(target),
        DBT_LOG_PATH=str(work / "dbt-logs"),
    )
    env.pop("CHANGELAKE_DBT_ARGS", None)  # the continuous mode's default dbt arguments, unless --dbt-args
    if args.dbt_args:
        env["CHANGELAKE_DBT_ARGS"] = args.dbt_args
    print(f"work directory {work}; source {name}: {args.rows:,} rows at {args.rate:,} changes/s", flush=True)
    create_items(d, schema, args.rows)
    conn = psycopg.connect(d, autocommit=True)
    sh = Shared()
    ctx = mp.get_context("spawn")
    stop_load, rate = ctx.Event(), ctx.Value("d", 0.0)
    gen = ctx.Process(target=load, args=(d, f"{schema}.items", args.rows, args.rate, stop_load, rate))
    proc: subprocess.Popen[str] | None = None
    threads: list[threading.Thread] = []
    thrift_pid: int | None = None
    try:
        conn.execute(f"create table {schema}.probes (id bigint primary key, note text)")
        source = {
            "kind": "postgres",
            "name": name,
            "dsn": d,
            "tables": [f"{schema}.items", f"{schema}.probes"],
            "snapshot": {"initial": False},
        }
        (work / "ingest.yml").write_text(yaml.safe_dump({"warehouse": str(wh), "sources": [source]}))
        with (work / "setup.log").open("w") as setup_log:
            subprocess.run(
                [sys.executable, "-m", "ingest", "-c", str(work / "ingest.yml"), "setup"],
                cwd=ROOT,
                env=env,
                check=True,
                stdout=setup_log,
                stderr=subprocess.STDOUT,
            )
        t0 = time.time()
        proc = subprocess.Popen(
            ["bash", str(ROOT / "ops" / "continuous.sh")],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        gen.start()
        threads = [
            threading.Thread(target=read_log, args=(proc, work / "continuous.log", target, kept, sh), daemon=True),
            threading.Thread(target=probe, args=(d, f"{schema}.probes", args.probe_interval, sh), daemon=True),
            threading.Thread(
                target=poll,
                args=(wh / "dbt" / "silver.db" / "consumer_records", name, args.poll_interval, sh),
                daemon=True,
            ),
        ]
        for t in threads:
            t.start()
        print("ops/continuous.sh started (warm engine start, then the first build, under load)", flush=True)

        printed = 0

        def progress() -> None:
            nonlocal printed
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"ops/continuous.sh exited {proc.returncode}; log: {work / 'continuous.log'}")
            while printed < len(sh.rounds):
                r = sh.rounds[printed]
                printed += 1
                print(f"  round {printed} ended at +{r.ended - t0:.0f} s: silver built in {r.wall_s} s", flush=True)

        while len(sh.rounds) < args.warmup_rounds:
            progress()
            if time.time() - t0 > WARMUP_TIMEOUT_S:
                raise SystemExit(f"no {args.warmup_rounds} dbt round(s) after {WARMUP_TIMEOUT_S:.0f} s")
            time.sleep(0.5)
        progress()
        w0 = sh.rounds[args.warmup_rounds - 1].ended
        w1 = w0 + args.seconds
        print(
            f"warm-up over at +{w0 - t0:.0f} s; measuring probes committed in the next {args.seconds:.0f} s", flush=True
        )
        while time.time() < w1:
            progress()
            time.sleep(0.5)
        window = {i: t for i, t in list(sh.commits.items()) if w0 <= t < w1}
        print(f"window over: {len(window)} probes; waiting until each is seen in consumer_records", flush=True)
        while any(i not in sh.seen for i in window) and time.time() < w1 + args.drain_timeout:
            progress()
            time.sleep(0.5)
        progress()
        waited = time.time()
    finally:
        sh.stop.set()
        stop_load.set()
        if gen.pid is not None:
            gen.join(timeout=30)
        leftovers = ""
        if proc is not None:
            pid_file = state / "cluster" / "thrift.pid"
            if pid_file.exists():
                thrift_pid = int(pid_file.read_text())
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # as a user's kill or systemd's stop does
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    leftovers += f"ops/continuous.sh ignored SIGTERM for {STOP_TIMEOUT_S:.0f} s; "
            # Anything of its session still running (zombies, exited and not yet reaped, do not count).
            ps = ["ps", "-o", "pid=,stat=,args=", "-g", str(proc.pid)]
            running = [
                line
                for line in subprocess.run(ps, capture_output=True, text=True).stdout.splitlines()
                if not line.split()[1].startswith("Z")
            ]
            if running:
                leftovers += f"left running in its session: {'; '.join(running)[:600]}; "
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if thrift_pid is not None and Path(f"/proc/{thrift_pid}").exists():
                leftovers += f"the engine it started (pid {thrift_pid}) still ran; "
            subprocess.run(
                ["bash", str(ROOT / "scripts" / "cluster.sh"), "down"], cwd=ROOT, env=env, capture_output=True
            )
        for t in threads:
            t.join(timeout=10)
        conn.execute(f"drop schema if exists {schema} cascade")
        for (slot,) in conn.execute(
            "select slot_name from pg_replication_slots where slot_name like %s", (f"%{sfx}",)
        ).fetchall():
            conn.execute(
                "select pg_terminate_backend(active_pid) from pg_replication_slots where slot_name = %s "
                "and active_pid is not null",
                (slot,),
            )
            time.sleep(0.5)
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
        conn.execute(f"drop publication if exists changelake_{name}")
        if proc is not None:
            print(
                f"stopped: ops/continuous.sh exit {proc.returncode}; "
                + (leftovers or "nothing left running; scripts/cluster.sh down ran"),
                flush=True,
            )

    # The raw figures first (a report can be printed again from them: --report WORKDIR), then the
    # source's commit time of each probe (consumer_records.updated_at) and the Delta commit time of
    # each version, read before the warehouse goes.
    raw: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_rate": rate.value,
        "dbt_args": args.dbt_args,
        "t0": t0,
        "w0": w0,
        "w1": w1,
        "waited": waited,
        "window": window,
        "seen": sh.seen,
        "rounds": [(r.ended, r.wall_s) for r in sh.rounds],
        "failed_rounds": sh.failed_rounds,
        "poll_errors": sh.poll_errors,
        "updated": {},
        "version_ts": {},
    }
    try:
        dt = DeltaTable(str(wh / "dbt" / "silver.db" / "consumer_records"))
        sql = f"select record_pk, updated_at from t where source = '{name}' and table_name = 'probes'"
        raw["updated"] = {
            int(json.loads(r["record_pk"])["id"]): r["updated_at"].timestamp()
            for r in pa.table(QueryBuilder().register("t", dt).execute(sql).read_all()).to_pylist()
        }
        raw["version_ts"] = {h["version"]: h["timestamp"] / 1000 for h in dt.history()}
    finally:
        (work / "raw.json").write_text(json.dumps(raw))
        conn.close()
        if not args.keep:
            shutil.rmtree(wh, ignore_errors=True)
            shutil.rmtree(state / "cluster" / "local", ignore_errors=True)
    report(work)


def report(work: Path) -> None:
    """Print the result from <work>/raw.json and the rounds' run_results; write <work>/rounds.json."""
    raw = json.loads((work / "raw.json").read_text())
    args = raw["args"]
    window = {int(i): t for i, t in raw["window"].items()}
    seen = {int(i): (t, int(v)) for i, (t, v) in raw["seen"].items()}
    updated = {int(i): t for i, t in raw["updated"].items()}
    version_ts = {int(v): t for v, t in raw["version_ts"].items()}
    t0, w0, w1, waited = raw["t0"], raw["w0"], raw["w1"], raw["waited"]
    rounds = []
    for k, (ended, wall_s) in enumerate(raw["rounds"], start=1):
        kept = work / "run_results" / f"round_{k}.json"
        rounds.append(Round(ended, wall_s, json.loads(kept.read_text()) if kept.exists() else None))

    inf = float("inf")
    lags = sorted(seen[i][0] - t if i in seen else inf for i, t in window.items())
    delta_lags = sorted(
        version_ts[seen[i][1]] - t if i in seen and seen[i][1] in version_ts else inf for i, t in window.items()
    )
    clock_skew = [updated[i] - t for i, t in window.items() if i in updated]
    starts = {k: rounds[k - 1].ended for k in range(1, len(rounds))}
    summaries = [
        {"round": k + 1, **round_summary(r, starts.get(k))} for k, r in enumerate(rounds) if w0 < r.ended <= waited
    ]
    (work / "rounds.json").write_text(json.dumps(summaries, indent=1))
    waited_s = waited - w1

    print()
    print(
        f"ops/continuous.sh, dbt arguments {raw.get('dbt_args') or 'build --exclude-resource-type unit_test'}"
        + ("" if raw.get("dbt_args") else " (the default)")
        + "; warm engine local[2]; "
        f"load {raw['load_rate']:,.0f} row changes/s achieved over the run ({int(args['rows']):,}-row table); "
        f"a probe every {args['probe_interval']} s"
    )
    print(
        f"warm-up (engine start + {args['warmup_rounds']} round(s)): {w0 - t0:.0f} s; window {w1 - w0:.0f} s: "
        f"{len(window)} probes, {sum(1 for x in lags if x == inf)} not seen {waited_s:.0f} s after it"
    )
    if lags:
        p50, p95 = quantile(lags, 0.5), quantile(lags, 0.95)
        print(f"source commit -> row visible in consumer_records (poller, every {args['poll_interval']} s):")
        print(f"  p50 {fmt(p50, waited_s)} (goal <= {GOAL_P50_S:.0f} s: {'met' if p50 <= GOAL_P50_S else 'not met'})")
        print(f"  p95 {fmt(p95, waited_s)} (goal <= {GOAL_P95_S:.0f} s: {'met' if p95 <= GOAL_P95_S else 'not met'})")
        print(f"  max {fmt(lags[-1], waited_s)}; min {fmt(lags[0], waited_s)}")
        print(
            f"  by the Delta commit time of the version first seen: p50 {fmt(quantile(delta_lags, 0.5), waited_s)}, "
            f"p95 {fmt(quantile(delta_lags, 0.95), waited_s)}, max {fmt(delta_lags[-1], waited_s)}"
        )
    if clock_skew:
        print(
            f"  check: source commit time (updated_at) - prober's clock after commit: median "
            f"{statistics.median(clock_skew) * 1000:.0f} ms over {len(clock_skew)} probes"
        )
    if summaries:
        print(f"dbt rounds ending in the window and the drain: {len(summaries)}")
        for s in summaries:
            print(
                f"  round {s['round']}: silver built in {s['wall_s']} s"
                + (
                    f"; dbt elapsed {s['dbt_elapsed_s']:.0f} s, models {s['models_s']:.0f} s, tests "
                    f"{s['tests_s']:.0f} s (summed node times, up to 4 threads)"
                    if "dbt_elapsed_s" in s
                    else ""
                )
                + (
                    f"; consumer_records committed {s['consumer_records_committed_at_s']:.0f} s into the round"
                    if "consumer_records_committed_at_s" in s
                    else ""
                )
            )
        print(f"  median 'silver built in': {statistics.median(s['wall_s'] for s in summaries):.0f} s")
    with_results = [s for s in summaries if "nodes" in s]
    if with_results:
        nodes = {n for s in with_results for n in s["nodes"]}
        node_med = {n: statistics.median(s["nodes"].get(n, 0.0) for s in with_results) for n in nodes}
        top = sorted(node_med.items(), key=lambda kv: kv[1], reverse=True)[:8]
        print("  slowest nodes (median s): " + ", ".join(f"{n} {v:.1f}" for n, v in top))
    if raw["failed_rounds"]:
        print(f"failed dbt rounds: {len(raw['failed_rounds'])} (log: {work / 'continuous.log'})")
    if raw["poll_errors"]:
        print(f"delta-rs reads that failed: {len(raw['poll_errors'])}, first: {raw['poll_errors'][0][:300]}")
    print(f"log, raw.json, rounds.json and each round's run_results: {work}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--report":
        report(Path(sys.argv[2]))
    else:
        main()
