"""Shape changes told apart by column identity (pg_attribute.attnum), not by names, on a real server.

`drop column a; rename column b to a; add column b` between two observations leaves the same
names and types: by names it is no change at all, so the table was not re-snapshotted and bronze
kept the old `a` values under `a` while the source's `a` now holds what was `b`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingest.bronze.writer import BronzeWriter
from ingest.sources.postgres.schema_changes import shape_change_kinds
from tests.helpers.bronze_fold import live_records, table_rows
from tests.helpers.pg import capture_once, prepare

pytestmark = pytest.mark.integration

GAP_DDL = "alter table items drop column a; alter table items rename column b to a; alter table items add column b text"
GAP_KINDS = {"added": ["b"], "dropped": ["a"], "renamed": ["b -> a"]}


def _last_kinds(warehouse: Path, source: str) -> dict[str, list[str]]:
    shapes = [sh for sh, _ in BronzeWriter(warehouse).shape_history(source) if sh.table_name == "items"]
    assert len(shapes) >= 2, f"one shape of items recorded: {shapes}"
    return shape_change_kinds(shapes[-2], shapes[-1])


@pytest.mark.parametrize("row_after", [True, False], ids=["met_by_the_stream", "met_by_the_start_check"])
def test_drop_rename_add_is_dropped_renamed_added_and_the_table_resnapshotted(
    warehouse: Path, make_source: Any, row_after: bool
) -> None:
    """Reported by attnum and the table re-read, whether the stream meets the new shape or the start's check does.

    With a row change after the DDL the stream's Relation message brings the shape; without one
    the start's catalog check finds it (its re-snapshot, requested when that run's snapshots are
    done, is read by the next run).
    """
    s = make_source("create table items (id int primary key, a text, b text)", ["items"])
    src = s.config()
    prepare(src)
    s.execute("insert into items values (1, 'a1', 'b1'), (2, 'a2', 'b2')")
    capture_once(warehouse, src, snapshots=True)
    s.execute(GAP_DDL)
    if row_after:
        s.execute("insert into items values (3, 'a3', 'b3')")
    capture_once(warehouse, src, snapshots=True)
    if not row_after:
        capture_once(warehouse, src, snapshots=True)
    assert _last_kinds(warehouse, s.name) == GAP_KINDS
    table = f"{s.schema}.items"
    assert live_records(warehouse, s.name)[table] == table_rows(s.conn, table)
