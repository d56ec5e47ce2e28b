"""Whether bronze holds anything new for dbt since a recorded state, read from the Delta logs (no JVM).

ops/scheduled_job.sh records the bronze tables' Delta versions before a dbt build that succeeds and,
next round, asks whether ingest committed anything silver would load since: a change event in
`wal_events` (a file whose statistics say it holds rows other than logical messages), or any new
row in another table but `stream_positions`. A `run --once` always commits its drain marker (a
logical message) and raises its position; neither is new to silver, so such a round needs no dbt
(dbt's own run-state check would find the same, after starting a JVM). Anything it cannot read
exactly (a missing commit file, a file without statistics, a removed file: compaction) counts as new.

Usage: python -m ingest.ops.bronze_news versions BRONZE_DIR        -> the versions as JSON (stdout)
       python -m ingest.ops.bronze_news news BRONZE_DIR STATE_FILE -> exit 0 and why when there is news
                                                                      (or no state), exit 3 when none
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Tables whose new rows are not new to silver: positions only move the safe bound.
POSITIONS_ONLY = frozenset({"stream_positions"})
# Logical messages (heartbeats, drain markers): wal_events rows silver leaves out.
MESSAGE_ACTION = "message"
NOTHING_NEW = 3


def versions(bronze: Path) -> dict[str, int]:
    """Each bronze table's latest Delta version (its highest-numbered commit file)."""
    out: dict[str, int] = {}
    for log in sorted(bronze.glob("*/_delta_log")):
        commits = [int(p.stem) for p in log.glob("*.json") if p.stem.isdigit()]
        if commits:
            out[log.parent.name] = max(commits)
    return out


def _news_in_commit(table: str, actions: list[dict[str, Any]]) -> str | None:
    for action in actions:
        if "remove" in action:
            return f"{table}: a file was removed (compaction or rewrite)"
        add = action.get("add")
        if add is None:
            continue
        if table != "wal_events":
            return f"{table}: new rows"
        stats = json.loads(add.get("stats") or "{}")
        low, high = stats.get("minValues", {}).get("action"), stats.get("maxValues", {}).get("action")
        if stats.get("numRecords", 1) and not (low == high == MESSAGE_ACTION):
            return "wal_events: new change events"
    return None


def news(bronze: Path, recorded: dict[str, int]) -> str | None:
    """Why bronze has something for silver since `recorded` (table -> version), or None."""
    for table, version in versions(bronze).items():
        if table in POSITIONS_ONLY:
            continue
        since = recorded.get(table)
        if since is None:
            return f"{table}: not in the recorded state"
        for v in range(since + 1, version + 1):
            commit = bronze / table / "_delta_log" / f"{v:020d}.json"
            if not commit.exists():
                return f"{table}: commit {v} is not readable"
            actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
            reason = _news_in_commit(table, actions)
            if reason is not None:
                return reason
    return None


def main(argv: list[str]) -> int:
    """The command line (module docstring); returns the exit code."""
    if len(argv) == 2 and argv[0] == "versions":
        print(json.dumps(versions(Path(argv[1])), sort_keys=True))
        return 0
    if len(argv) == 3 and argv[0] == "news":
        state = Path(argv[2])
        if not state.exists():
            print("no recorded state")
            return 0
        reason = news(Path(argv[1]), json.loads(state.read_text()))
        if reason is None:
            return NOTHING_NEW
        print(reason)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
