"""Benchmark P2b (issue 21): a scheduled `dbt build` with nothing new costs seconds, not a batch's build.

For each history size H (default 1M events; add 10M to see whether the no-op grows with history),
in its own fresh warehouse, with the synthetic bronze of bench/dbt_merge_scaling.py (same generator,
same 100k-event batch shape):
  1. bronze history of H events, then `dbt run` of every model (not measured);
  2. MEASURED, --repeat times: `dbt build --exclude-resource-type unit_test` with nothing new in
     bronze (what ops/scheduled_job.sh runs; unit tests are for CI); with several sizes, step 1 is
     done for every size first and the no-op builds alternate between the warehouses;
  3. the batch (--batch events, plus re-delivered duplicates) appended to bronze, positions raised;
  4. MEASURED: the same `dbt build` taking the batch; then silver is checked against the generated
     data (row counts and max seq from the Delta log statistics).
With --thrift, between 2 and 3: the Spark Thrift Server of scripts/cluster.sh is started on the same
warehouse (not measured) and the no-op build is MEASURED --repeat times with `--target cluster` (the
long-lived Spark docs/dbt.md recommends for frequent schedules), then the cluster is stopped.
Prints per size the wall times (dbt process, JVM start included) and, per model, dbt's
execution_time, then the line `P2b` with the no-op build, the batch build and their ratio (goal
<= 0.2) for the smallest size and, with two sizes, the line `P2b history` with no-op(largest H) /
no-op(smallest H) (goal <= 1.1).

Only one Spark/dbt process runs at a time; run it under the Spark lock. Usage:
  .venv/bin/python bench/dbt_noop_build.py [--history 1000000 [10000000]] [--batch 100000]
      [--tables 10] [--touched-tables 2] [--repeat 2] [--thrift] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
DBT = Path(sys.executable).with_name("dbt")
BUILD = ["build", "--exclude-resource-type", "unit_test"]

_spec = importlib.util.spec_from_file_location("dbt_merge_scaling", ROOT / "bench" / "dbt_merge_scaling.py")
assert _spec is not None and _spec.loader is not None
scaling: Any = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaling)


def run_build(wh: Path, work: Path, label: str, args: list[str]) -> dict[str, Any]:
    """One dbt process on warehouse `wh`: its wall time, dbt's elapsed time and per-node times.

    Every build of a warehouse shares one target directory, as a scheduled project's runs share
    its target/: dbt parses the project in full once and partially (its saved manifest) after.
    """
    target, logs = work / "target", work / f"logs-{label}"
    env = dict(
        os.environ,
        PWD=str(ROOT),
        CHANGELAKE_WAREHOUSE=str(wh),
        DBT_PROFILES_DIR=str(ROOT),
        DBT_TARGET_PATH=str(target),
        DBT_LOG_PATH=str(logs),
    )
    t0 = time.monotonic()
    r = subprocess.run([str(DBT), *args, "--project-dir", str(ROOT)], env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    results_file = target / "run_results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {"results": []}
    if results_file.exists():
        results_file.rename(work / f"run_results-{label}.json")
    # A failing data test is reported, not fatal: the timing still holds; an erroring node is fatal.
    failed = [
        f"{res['unique_id']} ({res['status']})"
        for res in results["results"]
        if res["status"] in ("fail", "warn", "skipped")
    ]
    broken = [
        res["unique_id"]
        for res in results["results"]
        if res["status"] not in ("success", "pass", "fail", "warn", "skipped")
    ]
    if r.returncode != 0 and (broken or not failed):
        raise SystemExit(f"dbt ({label}) failed after {wall:.0f}s:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}")
    for node in failed:
        print(f"  [{label}] WARNING: {node}", flush=True)
    nodes = {res["unique_id"]: (res["execution_time"], res.get("message") or "") for res in results["results"]}
    return {
        "wall": wall,
        "elapsed": results.get("elapsed_time") or 0.0,
        "nodes": nodes,
        "first_node_s": first_node_delay(logs / "dbt.log"),
    }


def thrift_noop_builds(wh: Path, work: Path, repeat: int) -> list[dict[str, Any]]:
    """The no-op build on the `cluster` target: a Thrift server started (not measured) on `wh`."""
    env = dict(os.environ, CHANGELAKE_WAREHOUSE=str(wh), CHANGELAKE_STATE=str(work / "state"))
    cluster = ["bash", str(ROOT / "scripts" / "cluster.sh")]
    t0 = time.monotonic()
    subprocess.run([*cluster, "up"], env=env, cwd=ROOT, check=True, capture_output=True)
    print(f"  Thrift server up in {time.monotonic() - t0:.0f}s (not measured)", flush=True)
    try:
        return [run_build(wh, work, f"thrift-noop-{i + 1}", [*BUILD, "--target", "cluster"]) for i in range(repeat)]
    finally:
        subprocess.run([*cluster, "down"], env=env, cwd=ROOT, check=True, capture_output=True)


def first_node_delay(log: Path) -> float | None:
    """Seconds from the dbt process's first log line to the first node's start (dbt.log timestamps)."""
    first = start = None
    for line in log.read_text().splitlines():
        m = scaling._LOG_LINE.match(line.replace("\x1b[0m", ""))
        if not m:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        first = t if first is None else first
        if "Began running node" in m.group(4):
            start = t
            break
    return None if first is None or start is None else (start - first) % 86400


def summary(run: dict[str, Any]) -> str:
    models = {k.split(".")[-1]: v for k, v in run["nodes"].items() if k.startswith("model.")}
    tests = [v[0] for k, v in run["nodes"].items() if k.startswith("test.")]
    skipped = sorted(k for k, (_, msg) in models.items() if msg.startswith("skipped"))
    shown = ", ".join(f"{k} {secs:.1f}s" for k, (secs, _) in sorted(models.items(), key=lambda x: -x[1][0])[:6])
    return (
        f"wall {run['wall']:.1f}s (before the first node {run['first_node_s'] or 0:.1f}s, dbt elapsed "
        f"{run['elapsed']:.1f}s); {len(tests)} data tests {sum(tests):.1f}s; slowest models: {shown}; "
        f"skipped: {', '.join(skipped) or 'none'}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history", type=int, nargs="+", default=[1_000_000])
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--touched-tables", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="no-op builds per size")
    p.add_argument("--workdir", type=Path, help="parent of the warehouses (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the warehouses and logs")
    p.add_argument("--thrift", action="store_true", help="also measure the no-op build on the Thrift-server target")
    args = p.parse_args()
    if args.touched_tables > args.tables or min(args.history) < 3 * args.tables:
        raise SystemExit("need --touched-tables <= --tables and every history >= 3 * tables")
    step = args.tables // args.touched_tables
    touched = sorted((3 + i * step) % args.tables for i in range(args.touched_tables))
    print("command: " + shlex.join([os.path.relpath(PY, ROOT), os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]))
    print(
        f"measured: `dbt {' '.join(BUILD)}` (wall of the dbt process); batch {args.batch:,} events on "
        f"{args.touched_tables} of {args.tables} tables; cores: {os.cpu_count()}",
        flush=True,
    )
    work = args.workdir or Path(tempfile.mkdtemp(prefix="changelake-noop-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        for history in sorted(args.history):
            hw = work / f"h{history}"
            shutil.rmtree(hw, ignore_errors=True)
            wh = hw / "warehouse"
            wh.mkdir(parents=True)
            r: dict[str, Any] = {"history": history, "hw": hw, "wh": wh, "noop": []}
            r["gen_history"], _ = scaling.run_step("history", str(wh), str(history), str(args.tables))
            r["build"] = run_build(wh, hw, "history", ["run"])
            print(
                f"[H={history:,}] bronze {r['gen_history']:.0f}s; dbt run of the history {r['build']['wall']:.0f}s",
                flush=True,
            )
            want = scaling.expected(history, args.batch)
            scaling.quick_check(wh, want["history_events"], want["history_keys"], "history build")
            rows.append(r)
        # The no-op builds alternate between the warehouses, so that a slower spell of the machine
        # falls on every size alike rather than on one.
        for i in range(args.repeat):
            for r in rows:
                r["noop"].append(run_build(r["wh"], r["hw"], f"noop-{i + 1}", BUILD))
                print(f"[H={r['history']:,}] no-op build {i + 1}: {summary(r['noop'][-1])}", flush=True)
        for r in rows if args.thrift else []:
            r["thrift"] = thrift_noop_builds(r["wh"], r["hw"], args.repeat)
            for i, run in enumerate(r["thrift"], 1):
                print(f"[H={r['history']:,}] no-op build {i}, Thrift target: {summary(run)}", flush=True)
        for r in rows:
            history, wh = r["history"], r["wh"]
            want = scaling.expected(history, args.batch)
            scaling.run_step(
                "batch", str(wh), str(history), str(args.batch), str(args.tables), ",".join(map(str, touched))
            )
            r["batch"] = run_build(wh, r["hw"], "batch", BUILD)
            scaling.quick_check(wh, want["events"], want["keys"], "batch build")
            print(f"[H={history:,}] batch build: {summary(r['batch'])}", flush=True)
    finally:
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if not rows or any("batch" not in r for r in rows):
        return
    print()
    for r in rows:
        noop = min(x["wall"] for x in r["noop"])
        walls = ", ".join(f"{x['wall']:.1f}s" for x in r["noop"])
        print(
            f"H={r['history']:,}: no-op builds {walls} (best {noop:.1f}s, median "
            f"{statistics.median(x['wall'] for x in r['noop']):.1f}s); {args.batch:,}-event build "
            f"{r['batch']['wall']:.1f}s"
        )
        if "thrift" in r:
            walls = ", ".join(f"{x['wall']:.1f}s" for x in r["thrift"])
            print(f"H={r['history']:,}: no-op builds on the Thrift-server target {walls}")
    lo = rows[0]
    noop, batch = min(x["wall"] for x in lo["noop"]), lo["batch"]["wall"]
    print(
        f"P2b no-op dbt build {noop:.1f}s, {args.batch:,}-event dbt build {batch:.1f}s, ratio {noop / batch:.3f} "
        f"(goal <= 0.2; H={lo['history']:,})"
    )
    if len(rows) > 1:
        hi = rows[-1]
        hi_noop = min(x["wall"] for x in hi["noop"])
        hi_med, lo_med = (statistics.median(x["wall"] for x in r["noop"]) for r in (hi, lo))
        print(
            f"P2b history no-op(H={hi['history']:,}) {hi_noop:.1f}s / no-op(H={lo['history']:,}) {noop:.1f}s "
            f"= {hi_noop / noop:.3f} (goal <= 1.1; best of {args.repeat} each; medians {hi_med:.1f}s / "
            f"{lo_med:.1f}s = {hi_med / lo_med:.3f})"
        )


if __name__ == "__main__":
    main()
