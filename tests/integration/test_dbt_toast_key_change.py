"""A primary-key change of a row whose TOASTed value is unchanged: one round leaves silver equal to the source."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pg import bronze_events, capture_once, prepare
from tests.helpers.silver import dbt, silver, source_rows

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

# `body` is stored out of line and uncompressed, and random hex does not compress anyway: every
# value is TOASTed, so an update that leaves it alone sends the unchanged-TOAST marker, not the value.
TABLES = """
create table docs (id int primary key, n int, body text);
alter table docs alter body set storage external;
create table docs_full (id int primary key, n int, body text);
alter table docs_full alter body set storage external;
alter table docs_full replica identity full;
"""
KEYS = {"docs": ["id"], "docs_full": ["id"]}


def body() -> str:
    return secrets.token_hex(2048)


def one_round(warehouse: Path, s: Any) -> None:
    """A round: `run --once`, then the silver models (the folds under test: their data tests and
    gold are the dbt flow's to run, and cost more than the folds on this little data)."""
    capture_once(warehouse, s.config(snapshot={"initial": False}), snapshots=True)
    dbt(warehouse, "run", "--select", "silver")


def folds_moved_toast(warehouse: Path) -> bool:
    """Whether the last run of consumer_records planned the CTEs completing moved TOAST values.

    They are planned only when the run's batch holds a key change with unchanged TOAST columns
    (macro consumer_records_scan_bounds, moves_toast): they are most of the fold's plan.
    """
    compiled = warehouse.parent / "dbt-target" / "compiled" / "changelake" / "models" / "silver"
    return "moved_toast_sources" in (compiled / "consumer_records.sql").read_text()


def assert_silver_is_the_source(warehouse: Path, s: Any) -> None:
    records = [r for r in silver(warehouse, "consumer_records") if r.source == s.name]
    assert [r.record_pk for r in records if r.needs_reread] == []
    for table, pk in KEYS.items():
        live = {r.record_pk: json.loads(r.record) for r in records if r.table_name == table and not r.deleted}
        assert live == source_rows(s, table, pk), f"{table} differs"


def test_key_change_with_unchanged_toast_is_complete_after_one_round(warehouse: Path, make_source: Any) -> None:
    """A key change that leaves a TOASTed value unchanged left the new key's record without that
    column and flagged needs_reread after the round; only the next round's re-read completed it.

    Under the default replica identity the value is the old key's last one (a row inserted or
    updated earlier in the batch, moved again in a chain of key changes, or stored in silver by the
    previous round); under REPLICA IDENTITY FULL the event's old tuple carries it, even for a row
    silver never saw.
    """
    s = make_source(TABLES, list(KEYS))
    # Rows that predate the slot and are never snapshotted: only the old tuple knows their body.
    s.execute("insert into docs_full values (1, 0, %s), (2, 0, %s)", (body(), body()))
    prepare(s.config())
    s.execute("insert into docs values (1, 0, %s), (2, 0, %s), (3, 0, %s), (4, 0, %s)", (body(),) * 4)
    s.execute("update docs set id = 101 where id = 1")
    s.execute("update docs set id = 102 where id = 2")
    s.execute("update docs set id = 202 where id = 102")  # a chain: the value moved twice
    s.execute("update docs set n = 1 where id = 3")  # in place, the body unchanged
    s.execute("update docs set id = 103 where id = 3")
    with s.conn.transaction():  # arrives, then is updated in place in the same transaction
        s.execute("update docs set id = 1004 where id = 4")
        s.execute("update docs set n = 2 where id = 1004")
    s.execute("update docs_full set id = 101 where id = 1")
    s.execute("update docs_full set n = 1 where id = 2")
    one_round(warehouse, s)
    moved = [e for e in bronze_events(warehouse, s.name) if e.old_record_pk]
    assert len(moved) == 6 and all(list(e.unchanged_toast) == ["body"] for e in moved)
    assert_silver_is_the_source(warehouse, s)
    assert folds_moved_toast(warehouse)

    # The next round: the old keys' values are in silver's stored rows, not in the batch.
    s.execute("update docs set id = 301 where id = 101")
    s.execute("update docs set id = 302 where id = 202")
    s.execute("update docs set id = 402 where id = 302")
    s.execute("update docs_full set id = 102 where id = 2")
    one_round(warehouse, s)
    assert_silver_is_the_source(warehouse, s)
    assert folds_moved_toast(warehouse)
