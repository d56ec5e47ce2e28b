"""Snapshots beside the stream (DESIGN §5): pages in bronze, writer rows, resume after SIGKILL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import capture_once, prepare

pytestmark = pytest.mark.integration


def pages(spark: Any, warehouse: Path, source: str) -> list[Any]:
    df = spark.read.format("delta").load(str(warehouse / "bronze" / "snapshot_pages")).where(f"source = '{source}'")
    return df.orderBy("table_name", "high_watermark_lsn", "row_index").collect()


def writers(spark: Any, warehouse: Path, source: str) -> list[Any]:
    df = spark.read.format("delta").load(str(warehouse / "bronze" / "stream_positions"))
    return df.where(f"source = '{source}'").collect()


def test_initial_snapshot_writes_keyset_pages_and_retires_its_writer(
    spark: Any, warehouse: Path, make_source: Any
) -> None:
    s = make_source(
        "create table a (id int primary key, v text, flag boolean);"
        "create table b (k1 text, k2 int, v jsonb, primary key (k1, k2));"
        "create table empty (id bigint primary key)",
        ["a", "b", "empty"],
    )
    s.execute("insert into a select g, 'v' || g, g % 2 = 0 from generate_series(1, 25) g")
    s.execute("""insert into b select 'k' || (g % 3), g, jsonb_build_object('g', g) from generate_series(1, 7) g""")
    prepare(s.config())
    capture_once(spark, warehouse, s.config(), snapshots=True, page_rows=10)

    got = pages(spark, warehouse, s.name)
    a = [r for r in got if r.table_name == "a"]
    assert [json.loads(r.record_pk)["id"] for r in a] == list(range(1, 26))
    assert [r.page_number for r in a] == [0] * 10 + [1] * 10 + [2] * 5
    assert [r.last_page for r in a] == [False] * 20 + [True] * 5
    assert json.loads(a[1].record) == {"id": 2, "v": "v2", "flag": True}
    assert a[-1].key_text == ["25"]
    hws = sorted({r.high_watermark_lsn for r in a})
    assert len(hws) == 3 and all(r.snapshot_xmax >= r.snapshot_xmin > 0 for r in a)
    b = [r for r in got if r.table_name == "b"]
    keys = [(json.loads(r.record_pk)["k1"], json.loads(r.record_pk)["k2"]) for r in b]
    assert keys == sorted(keys) and len(keys) == 7 and b[-1].last_page
    empty = [r for r in got if r.table_name == "empty"]
    assert len(empty) == 1 and empty[0].record_pk is None and empty[0].row_index == -1 and empty[0].last_page
    # Every snapshot writer retired; only the stream's row is left.
    assert [w.writer_id for w in writers(spark, warehouse, s.name)] == ["stream"]
    # The stream saw every watermark (the run drained past them).
    df = spark.read.format("delta").load(str(warehouse / "bronze" / "wal_events"))
    marks = df.where(f"source = '{s.name}' and message_prefix = 'changelake.watermark'").collect()
    assert len(marks) == 3 + 1 + 1
    assert max(m.commit_lsn for m in marks) > max(hws)

    # A second run snapshots nothing again: every table has a completed snapshot.
    capture_once(spark, warehouse, s.config(), snapshots=True, page_rows=10)
    assert len(pages(spark, warehouse, s.name)) == len(got)
