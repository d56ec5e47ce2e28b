"""Changing the publication on start does not renumber a replayed transaction (review finding D5).

A restart replays the transaction a crash cut in pages, and skips what bronze already holds by
position: correct only if pgoutput numbers the replay as before. Here a table is added to the
config between the crash and the restart, so the publication gains it before the replay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.pg import ROOT, bronze_events, prepare

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def _run(cfg: Path, crash_at: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_CRASH_AT"}
    if crash_at:
        env["CHANGELAKE_CRASH_AT"] = crash_at
    proc = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "run", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-2000:]
    return proc.returncode


def test_a_replayed_transaction_keeps_its_numbering_when_a_table_joins_the_publication(
    tmp_path: Path, make_source: Any
) -> None:
    s = make_source("create table a (id int primary key, v text); create table b (id int primary key)", ["a"])
    cfg = tmp_path / "ingest.yml"

    def write_config(tables: list[str]) -> None:
        source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": tables, "snapshot": {"initial": False}}
        doc = {"warehouse": str(tmp_path / "warehouse"), "batch": {"max_events": 10}, "sources": [source]}
        cfg.write_text(yaml.safe_dump(doc))

    write_config([f"{s.schema}.a"])
    prepare(s.config())
    with s.conn.transaction():  # larger than a batch, and interleaved with a table not yet captured
        for i in range(30):
            s.execute("insert into a values (%s, %s)", (i, f"a{i}"))
            s.execute("insert into b values (%s)", (i,))
    assert _run(cfg, "mid_transaction_flush:1") == -signal.SIGKILL
    first_page = bronze_events(tmp_path / "warehouse", s.name)
    assert 0 < len(first_page) < 30
    write_config([f"{s.schema}.a", f"{s.schema}.b"])  # the restart adds b to the publication first
    assert _run(cfg, None) == 0
    events = bronze_events(tmp_path / "warehouse", s.name)
    a = [e for e in events if e.table_name == "a"]
    assert [json.loads(e.record)["v"] for e in a] == [f"a{i}" for i in range(30)]  # each once, in order
    assert len({(e.commit_lsn, e.commit_index) for e in events}) == len(events)
    # PostgreSQL decodes the replay with the catalog as it was when the transaction committed: b was
    # not published then, so its rows of that transaction are not sent (its snapshot brings them).
    assert [e for e in events if e.table_name == "b"] == []
    # The replay was numbered as before: the first page's events are exactly the replay's first.
    assert [(e.commit_lsn, e.commit_index) for e in first_page] == [(e.commit_lsn, e.commit_index) for e in a][
        : len(first_page)
    ]
