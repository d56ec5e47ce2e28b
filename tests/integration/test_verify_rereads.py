"""`verify` on real PostgreSQL when silver holds keys waiting for a re-read (docs/verify.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.bronze.writer import BronzeWriter
from ingest.sources.postgres.verify import verify_tables
from ingest.verify import EXIT_NOT_VERIFIED, Status, exit_code, silver_path
from tests.helpers.pg import capture_once, prepare
from tests.integration.test_verify_edges import Ingesting, fold_snapshot

pytestmark = pytest.mark.integration


def test_verify_is_not_equal_while_keys_wait_for_a_reread(warehouse: Path, make_source: Any) -> None:
    """verify said `equal` (exit 0) while it left out the keys silver flags needs_reread, whose
    records it never compared; the table is now not verified (exit 7), the reason counting them.
    """
    s = make_source("create table docs (id int primary key, v text)", ["docs"])
    (docs,) = s.tables
    s.execute(f"insert into {docs} select g, 'v' || g from generate_series(1, 20) g")
    src = s.config()
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    writer = BronzeWriter(warehouse)
    fold_snapshot(warehouse, s.name)
    with Ingesting(warehouse, src):
        (r,) = verify_tables(src, writer, [docs], 30, 1000, 10, False, "run-1")
        assert r.status is Status.EQUAL, r

        # Silver as a fold leaves it when a value is unknown: the column missing, the key flagged.
        DeltaTable(silver_path(writer)).update(
            {"needs_reread": "true", "record": "'{\"id\":7}'"}, predicate="""record_pk = '{"id":7}'"""
        )
        (r,) = verify_tables(src, writer, [docs], 30, 1000, 10, False, "run-2")
    assert r.status is Status.NOT_VERIFIED and "1 key(s) wait for a re-read" in (r.reason or ""), r
    assert (r.skipped_keys, r.reread_keys, r.mismatches) == (1, 1, 0), r
    assert exit_code([r]) == EXIT_NOT_VERIFIED
    assert r.to_json(str)["reread_keys"] == 1
