"""The `changelake-ingest` command line: argument parsing and wiring only."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from functools import partial

from ingest.config import Config, config_summary, load_config
from ingest.errors import (
    BronzeUnavailableError,
    ConfigError,
    IngestError,
    RetriesExhaustedError,
    SourceUnavailableError,
)
from ingest.ops import logs
from ingest.ops.native_stderr import route_native_stderr

DEFAULT_CONFIG_ENV = "CHANGELAKE_CONFIG"
DEFAULT_CONFIG = "changelake.yml"
EXIT_INTERNAL_ERROR = 1
EXIT_USER_ERROR = 2
EXIT_TEMPFAIL = 75  # sysexits.h EX_TEMPFAIL: a source or the warehouse is unavailable; retry later
SNAPSHOT_ACTIONS = ("pause", "resume", "cancel")  # `snapshot <action> <table or snapshot id>`
log = logging.getLogger("ingest.cli")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="changelake-ingest", description="Capture source changes into bronze Delta tables."
    )
    p.add_argument(
        "-c",
        "--config",
        default=os.environ.get(DEFAULT_CONFIG_ENV, DEFAULT_CONFIG),
        help=f"YAML config (default: ${DEFAULT_CONFIG_ENV} or {DEFAULT_CONFIG})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log progress and decisions (INFO)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="text (key=value) or json (one object a line) on stderr (default: log.format, else text)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="stream changes into bronze (continuous, or --once)")
    r.add_argument("--once", action="store_true", help="drain to the source's current position, then exit")
    r.add_argument("--source", help="capture only this source")
    r.add_argument(
        "--metrics-port",
        type=int,
        metavar="N",
        help="serve Prometheus metrics on port N (0: off; default metrics.port)",
    )
    su = sub.add_parser("setup", help="check the sources and create publication and slot")
    su.add_argument("--source", help="only this source")
    sn = sub.add_parser(
        "snapshot",
        help="request a snapshot of one table (a running or the next `run` takes it), or pause, resume, cancel",
    )
    sn.add_argument(
        "table",
        nargs="+",
        metavar="[pause|resume|cancel] TABLE",
        help="schema.table (database.collection of a MongoDB source), as listed in the config; after pause, resume "
        "or cancel also a snapshot id (`status` lists them)",
    )
    sn.add_argument("--source", help="the source capturing the table (needed if several do)")
    sn.add_argument(
        "--cancel", action="store_true", help="remove the table's queued snapshot requests instead (stop `run` first)"
    )
    sn.add_argument(
        "--where",
        metavar="PREDICATE",
        help="a filtered snapshot: only the rows this SQL predicate selects, or for a MongoDB collection the "
        'documents this query filter in Extended JSON selects (\'{"status": "open"}\'); checked before it is queued',
    )
    s = sub.add_parser("status", help="positions, safe bound, slot lag, WAL status and snapshot progress")
    s.add_argument("--source", help="only this source")
    s.add_argument(
        "--json",
        action="store_true",
        help="one JSON document (docs/operations.md); exit 0 healthy, 3 lagging, 4 stale, 5 slot lost or unreachable",
    )
    v = sub.add_parser(
        "verify", help="compare source tables with silver at one position of the source (docs/verify.md)"
    )
    v.add_argument(
        "tables",
        nargs="*",
        metavar="schema.table",
        help="tables (database.collection of a MongoDB source) to verify (default: every configured one)",
    )
    v.add_argument("--source", help="only this source (needed if several capture a table)")
    v.add_argument(
        "--json",
        action="store_true",
        help="one JSON document (docs/verify.md); exit 0 equal, 6 mismatches found, 7 could not verify",
    )
    v.add_argument(
        "--wait",
        type=float,
        default=120.0,
        metavar="S",
        help="wait up to S seconds for bronze to reach the position the source is read at (default 120)",
    )
    v.add_argument("--range-rows", type=int, default=1000, metavar="N", help="rows per checksum range (default 1000)")
    v.add_argument("--max-keys", type=int, default=100, metavar="N", help="keys listed per kind (default 100)")
    v.add_argument("--no-progress", action="store_true", help="no rows/s lines on stderr")
    d = sub.add_parser("discover", help="list the tables a source's selection takes, read-only (keys, sizes, refusals)")
    d.add_argument("--source", help="only this source")
    d.add_argument("--all", action="store_true", help="every table of the source, each saying if it is selected")
    d.add_argument(
        "--json",
        action="store_true",
        help="one JSON document (docs/configuration.md); exit 8 if a selected table is refused",
    )
    rm = sub.add_parser(
        "remask",
        help="rewrite bronze so every table's rows hold what its exclude/mask rules write now (stop `run` first; "
        "docs/masking.md)",
    )
    rm.add_argument("--source", help="only this source (default: every source with rules)")
    cf = sub.add_parser("config", help="check the config without touching a source, or print its JSON Schema")
    cf.add_argument("action", choices=("check", "schema"))
    g = sub.add_parser("gold", help="dbt gold models for the captured tables (docs/dbt.md)")
    gs = g.add_subparsers(dest="gold_command", required=True)
    gg = gs.add_parser(
        "generate", help="write one typed model (.sql + .yml) per table of table_columns and per MongoDB collection"
    )
    gg.add_argument(
        "--out", default="models/gold/generated", help="folder of the models (default models/gold/generated)"
    )
    gg.add_argument("--source", action="append", default=[], help="only this source (repeatable)")
    gg.add_argument(
        "--table-columns", metavar="PATH", help="silver table_columns (default <warehouse>/dbt/silver.db/table_columns)"
    )
    gg.add_argument(
        "--consumer-records",
        metavar="PATH",
        help="silver consumer_records, for MongoDB sources (default <warehouse>/dbt/silver.db/consumer_records)",
    )
    gg.add_argument(
        "--depth",
        type=int,
        default=1,
        metavar="N",
        help="MongoDB: flatten documents nested up to N levels into a__b columns (default 1: top-level fields)",
    )
    gg.add_argument("--no-comments", action="store_true", help="do not read column comments from Postgres sources")
    gg.add_argument(
        "--check", action="store_true", help="write nothing; exit 2 naming the models whose files would change (CI)"
    )
    return p


def _snapshot(cfg: Config, args: argparse.Namespace) -> str:
    from ingest import app

    words = list(args.table)
    action = words.pop(0) if len(words) == 2 and words[0] in SNAPSHOT_ACTIONS else None
    if args.cancel and action in (None, "cancel"):
        action = "cancel"
    if len(words) != 1 or args.cancel and action != "cancel" or action is not None and args.where is not None:
        raise ConfigError("snapshot takes TABLE [--where PREDICATE], or pause|resume|cancel and a table or snapshot id")
    if action == "cancel":
        return app.cancel_snapshot(cfg, words[0], args.source)
    if action is not None:
        return app.pause_snapshot(cfg, words[0], args.source, action == "pause")
    return app.snapshot(cfg, words[0], args.source, args.where)


def _verify(cfg: Config, args: argparse.Namespace) -> int:
    from ingest import app

    if args.range_rows < 1 or args.max_keys < 0 or args.wait < 0:
        raise ConfigError("verify: --range-rows must be at least 1, --max-keys and --wait not negative")
    run, fmt = app.verify(
        cfg, args.tables, args.source, args.wait, args.range_rows, args.max_keys, not args.no_progress
    )
    if args.json:
        print(json.dumps(run.document(fmt), indent=2))
    else:
        for r in run.results:
            print(r.line(partial(fmt, r.source)))
    return run.exit_code


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (2 for errors the user can fix)."""
    code = _command(argv)
    if argv is None:
        # The process ends when this returns. Its teardown garbage-collects every object the
        # imports made (pyarrow, psycopg, pydantic ...) again and again as modules are cleared:
        # 0.3-0.5 s of every command. Frozen, the collector skips them; atexit handlers (logging's
        # flush) still run, and the OS takes back the memory.
        gc.freeze()
    return code


def _command(argv: list[str] | None) -> int:
    """Parse `argv` (None: the process's command line) and run the command; its exit code."""
    args = _parser().parse_args(argv)
    # delta-rs reports a panic of its worker threads (e.g. an object-store writer after disk full)
    # on stderr itself, with a Rust backtrace when RUST_BACKTRACE asks for one; the error that
    # follows is ours, one line and an exit code, so the backtrace is only noise.
    os.environ["RUST_BACKTRACE"] = "0"
    if argv is None:  # the process's own command line: its fd 2 is ours to route (not a test calling main)
        route_native_stderr()
    level = logging.INFO if args.verbose else logging.WARNING
    logs.configure(level, args.log_format or "text")
    from ingest import app

    if args.command == "config" and args.action == "schema":  # needs no config file
        print(json.dumps(Config.model_json_schema(), indent=2))
        return 0
    try:
        cfg = load_config(args.config)
        logs.configure(level, args.log_format or cfg.log.format, logs.secrets_of(cfg))
        if args.command == "run":
            for line in app.run(cfg, once=args.once, source=args.source, metrics_port=args.metrics_port):
                print(line)
        elif args.command == "setup":
            for line in app.setup(cfg, args.source):
                print(line)
        elif args.command == "snapshot":
            print(_snapshot(cfg, args))
        elif args.command == "status" and args.json:
            doc = app.status_report(cfg, args.source)
            print(json.dumps(doc, indent=2))
            return int(doc["exit_code"])
        elif args.command == "verify":
            return _verify(cfg, args)
        elif args.command == "gold":
            from pathlib import Path

            from ingest import gold

            comments = not args.no_comments
            lines = gold.generate(
                cfg,
                Path(args.out),
                args.source,
                args.table_columns,
                comments,
                args.check,
                args.consumer_records,
                args.depth,
            )
            for line in lines:
                print(line)
        elif args.command == "discover":
            from ingest import discover

            listings = discover.discover(cfg, args.source, args.all)
            if args.json:
                print(json.dumps({"sources": [x.document() for x in listings]}, indent=2))
            else:
                print("\n".join(line for x in listings for line in discover.lines(x)))
            return discover.exit_code(listings)
        elif args.command == "remask":
            from ingest import remask

            for line in remask.remask(cfg, args.source):
                print(line)
        elif args.command == "config":
            for line in config_summary(cfg):
                print(line)
        elif args.command == "status":
            for st in app.status(cfg, args.source):
                print(f"source {st.source}")
                for line in st.lines:
                    print(f"  {line}")
    except BronzeUnavailableError as e:
        print(f"changelake-ingest: warehouse unavailable: {logs.redact(str(e))}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except (RetriesExhaustedError, SourceUnavailableError) as e:
        print(f"changelake-ingest: source unavailable: {logs.redact(str(e))}", file=sys.stderr)
        return EXIT_TEMPFAIL
    except IngestError as e:
        print(f"changelake-ingest: error: {logs.redact(str(e))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as e:  # a bug or a fault we do not classify yet: one line, the traceback in the log
        log.log(logging.INFO if args.verbose else logging.DEBUG, "internal error", exc_info=True)
        print(
            f"changelake-ingest: internal error: {type(e).__name__}: {logs.redact(str(e))} - nothing past durable "
            "data was acknowledged; run again with -v for the traceback and please report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
