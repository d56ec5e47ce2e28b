"""`changelake-ingest verify` on real PostgreSQL, ingest and one `dbt build` (docs/verify.md).

One dbt build makes silver; then verify runs against it: equal at rest, equal under a concurrent
write load with ingest running (the changed keys are skipped, nothing is reported), and after
silver is corrupted (one record changed, one deleted, one resurrected) exactly those three keys.
A targeted dbt build of the gold models then shows the mismatch in source_health and the
scheduled check (assert_last_verification_found_no_mismatches) fails; with more stream records
broken, the check of consumer_records against sequin_events names each break.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.helpers.delta_rows import read
from tests.helpers.ingest_process import ingest, start_run, stop, write_config
from tests.helpers.pg import capture_once, prepare
from tests.helpers.silver import NO_UNIT_TESTS, dbt, dbt_process, silver

pytestmark = pytest.mark.integration

SALT_ENV = "CHANGELAKE_TEST_VERIFY_SALT"
SALT = "verify-salt-" + "y" * 20
ROWS = 3000
LOADED = range(2001, 3001)  # the write load touches only these ids; the corruption others


def verify(cfg: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    p = ingest(cfg, "verify", "--json", "--wait", "60", *args, timeout=180)
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout), p.stderr


def load(s: Any, stop_flag: threading.Event, counter: list[int]) -> None:
    """Updates, deletes and re-inserts of ids in LOADED until told to stop."""
    import psycopg

    n = 0
    with psycopg.connect(s.dsn, autocommit=True) as c:
        while not stop_flag.is_set():
            i = LOADED.start + n % len(LOADED)
            with c.transaction():
                c.execute(f"update {s.schema}.items set qty = qty + 1, secret = secret || 'x' where id = %s", (i,))
                c.execute(f"delete from {s.schema}.items where id = %s", (i + 1,))
                c.execute(
                    f"insert into {s.schema}.items values (%s, 'again', 1, 's', 'h') on conflict (id) do nothing",
                    (i + 1,),
                )
            n += 1
            counter[0] = n
            time.sleep(0.002)


@pytest.mark.usefixtures("engine")
def test_verify_finds_exactly_the_corrupted_keys_and_nothing_under_load(
    tmp_path: Path, make_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    s = make_source("create table items (id int primary key, name text, qty int, secret text, hidden text)", ["items"])
    table = s.tables[0]
    s.execute(f"insert into {table} select g, 'n' || g, g % 7, 's' || g, 'h' || g from generate_series(1, {ROWS}) g")
    rules = {table: {"exclude_columns": ["hidden"], "mask_columns": ["secret"]}}
    warehouse = tmp_path / "warehouse"
    prepare(s.config())
    capture_once(warehouse, s.config(columns=rules, mask_salt_env=SALT_ENV), snapshots=True, page_rows=500)
    s.execute(f"update {table} set name = 'changed' where id <= 10")
    s.execute(f"delete from {table} where id between 11 and 15")
    capture_once(warehouse, s.config(columns=rules, mask_salt_env=SALT_ENV))
    dbt(warehouse, "build", *NO_UNIT_TESTS)

    source = {
        "kind": "postgres",
        "name": s.name,
        "dsn": s.dsn,
        "tables": [table],
        "columns": rules,
        "mask_salt_env": SALT_ENV,
    }
    cfg = write_config(tmp_path, source)
    run = start_run(cfg)
    try:
        # At rest: equal, every row compared, masked and excluded columns as bronze has them.
        code, doc, _ = verify(cfg)
        (t,) = doc["tables"]
        assert (code, doc["result"], t["status"]) == (0, "equal", "equal"), doc
        assert t["source_rows"] == t["silver_rows"] == ROWS - 5 and t["skipped_keys"] == 0
        assert t["ranges"] == 3 and t["mismatched_ranges"] == 0

        # Under a concurrent write load with ingest running: nothing is wrong, nothing is reported;
        # the keys changed after silver's position are skipped, not compared.
        stop_load, counter = threading.Event(), [0]
        writer = threading.Thread(target=load, args=(s, stop_load, counter))
        writer.start()
        try:
            time.sleep(1.0)
            code, doc, err = verify(cfg)
        finally:
            stop_load.set()
            writer.join()
        (t,) = doc["tables"]
        assert (code, t["status"]) == (0, "equal"), doc
        assert counter[0] > 50 and t["skipped_keys"] > 0, (counter, t)
        assert t["missing"] == t["extra"] == t["different"] == 0

        # Corrupt silver (delta-rs, as a broken pipeline would): id 100 changed, id 200 gone,
        # id 12 (deleted at the source) resurrected.
        path = str(warehouse / "dbt" / "silver.db" / "consumer_records")
        recs = {r.record_pk: r.asDict() for r in silver(warehouse, "consumer_records") if r.source == s.name}
        changed, back = recs['{"id":100}'], recs['{"id":12}']
        assert back["deleted"] and not changed["deleted"] and not recs['{"id":200}']["deleted"]
        changed["record"] = json.dumps({**json.loads(changed["record"]), "qty": 999}, separators=(",", ":"))
        back["deleted"], back["record"] = False, '{"id":12,"name":"n12","qty":5}'
        dt = DeltaTable(path)
        where = f"source = '{s.name}' and record_pk in ('{{\"id\":100}}', '{{\"id\":200}}', '{{\"id\":12}}')"
        dt.delete(where)
        schema = dt.schema().to_arrow()
        write_deltalake(path, pa.Table.from_pylist([changed, back], schema=pa.schema(schema)), mode="append")

        code, doc, err = verify(cfg)
        (t,) = doc["tables"]
        assert (code, doc["result"], t["status"]) == (6, "mismatch", "mismatch"), doc
        assert t["missing_keys"] == ['{"id":200}']
        assert t["extra_keys"] == ['{"id":12}']
        assert t["different_keys"] == [{"key": '{"id":100}', "columns": ["qty"]}]
        assert (t["missing"], t["extra"], t["different"]) == (1, 1, 1)
        assert 1 <= t["mismatched_ranges"] <= 3 and t["unresolved_ranges"] == 0
    finally:
        code, err = stop(run)
        assert code == 0, err

    # Every run is in bronze.verification_runs, one row each.
    rows = read(warehouse / "bronze" / "verification_runs", f"source = '{s.name}'", "finished_at")
    assert [r.status for r in rows] == ["equal", "equal", "mismatch"]
    assert json.loads(rows[-1].details)["missing_keys"] == ['{"id":200}']

    # The gold models show it, and the scheduled check fails on it (one targeted dbt build).
    p = dbt_process(warehouse, "build", "--select", "verification_runs", "source_health", "--store-failures")
    assert p.returncode == 1 and "assert_last_verification_found_no_mismatches" in p.stdout, p.stdout[-4000:]
    # source_health is a view: its failing rows, as the test stored them (--store-failures), are a
    # table (Parquet: dbt-spark's default format for stored test failures).
    audit = warehouse / "dbt" / "dbt_test__audit.db" / "assert_last_verification_found_no_mismatches"
    (row,) = [r for r in pq.read_table(audit).to_pylist() if r["source"] == s.name]
    health = SimpleNamespace(**row)
    assert (health.tables_mismatched, health.verification_mismatches, health.tables_verified_equal) == (1, 3, 0)
    assert health.last_verified_at is not None

    # consumer_records against sequin_events (tests/dbt/assert_consumer_records_are_their_last_events.sql)
    # finds each way a stream record can break, named: ids 1-10 were updated and 11-15 deleted on
    # the stream; id 12, resurrected above, kept its deleted_at. Broken here (delta-rs again):
    recs = {r.record_pk: r.asDict() for r in silver(warehouse, "consumer_records") if r.source == s.name}
    key = '{{"id":{}}}'.format
    broken = {key(i): dict(recs[key(i)]) for i in (1, 2, 3, 4, 11)}
    assert all(r["origin"] == "stream" for r in broken.values()) and recs[key(5)]["origin"] == "stream"
    broken[key(1)]["updated_at"] += timedelta(seconds=1)
    broken[key(2)]["seq"] += 1
    broken[key(3)]["commit_lsn"] -= 1
    broken[key(4)]["commit_index"] += 1
    broken[key(11)]["deleted_at"] += timedelta(seconds=1)
    stray = {**recs[key(6)], "record_pk": key(9999)}  # a stream record no event made
    dt = DeltaTable(path)
    dt.delete(f"source = '{s.name}' and record_pk in ({', '.join(repr(k) for k in [*broken, key(5)])})")
    rows = [*broken.values(), stray]
    write_deltalake(path, pa.Table.from_pylist(rows, schema=pa.schema(dt.schema().to_arrow())), mode="append")
    check = "assert_consumer_records_are_their_last_events"
    p = dbt_process(warehouse, "test", "--select", check, "--store-failures", "--vars", "{changelake_full_tests: true}")
    assert p.returncode == 1 and check in p.stdout, p.stdout[-4000:]
    found = {
        r["record_pk"]: r["mismatch"]
        for r in pq.read_table(warehouse / "dbt" / "dbt_test__audit.db" / check).to_pylist()
        if r["record_source"] == s.name
    }
    assert found == {
        key(1): "updated_at is not the commit time of its event",
        key(2): "seq is not the seq of its event",
        key(3): "record behind the last event for its key",
        key(4): "stream record past the last event for its key",
        key(5): "no record for a key with events",
        key(11): "deleted_at is not the commit time of its event",
        key(12): "deleted and deleted_at disagree",
        key(9999): "stream record without an event for its key",
    }, found
