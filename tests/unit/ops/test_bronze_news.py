"""ingest/ops/bronze_news.py on bronze written the way ingest writes it (delta-rs, ingest's schemas)."""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import write_deltalake

from ingest.bronze.schemas import SOURCE_RELATIONS, WAL_EVENTS
from ingest.ops import bronze_news
from tests.helpers import bronze_fixture
from tests.helpers.bronze_fixture import ev, relations, table


def test_messages_and_positions_are_no_news_change_events_are(tmp_path: Path) -> None:
    bronze_fixture.write(str(tmp_path), 1)
    bronze = tmp_path / "bronze"
    recorded = bronze_news.versions(bronze)
    assert set(recorded) >= {"wal_events", "stream_positions", "source_relations", "snapshot_pages"}
    assert bronze_news.news(bronze, recorded) is None

    # What a `run --once` with nothing to capture commits: its drain marker and a raised position.
    write_deltalake(
        str(bronze / "wal_events"), table(WAL_EVENTS, [ev(205, 0, "message", None, None, None)]), mode="append"
    )
    bronze_fixture.write(str(tmp_path), 3)
    assert bronze_news.versions(bronze) != recorded
    assert bronze_news.news(bronze, recorded) is None

    write_deltalake(
        str(bronze / "wal_events"),
        table(
            WAL_EVENTS,
            [
                ev(206, 0, "message", None, None, None),
                ev(206, 1, "insert", "customers", {"id": 9}, bronze_fixture.customer(9, "Bo")),
            ],
        ),
        mode="append",
    )
    assert bronze_news.news(bronze, recorded) == "wal_events: new change events"
    assert bronze_news.news(bronze, bronze_news.versions(bronze)) is None


def test_unreadable_history_and_other_tables_count_as_news(tmp_path: Path) -> None:
    bronze_fixture.write(str(tmp_path), 1)
    bronze = tmp_path / "bronze"
    recorded = bronze_news.versions(bronze)
    assert bronze_news.news(bronze, {k: v for k, v in recorded.items() if k != "snapshot_pages"}) == (
        "snapshot_pages: not in the recorded state"
    )
    write_deltalake(
        str(bronze / "wal_events"), table(WAL_EVENTS, [ev(205, 0, "message", None, None, None)]), mode="append"
    )
    latest = bronze_news.versions(bronze)["wal_events"]
    log = bronze / "wal_events" / "_delta_log"
    (log / f"{latest:020d}.json").rename(tmp_path / "moved.json")
    (log / f"{latest + 1:020d}.json").write_text((tmp_path / "moved.json").read_text())
    assert bronze_news.news(bronze, recorded) == f"wal_events: commit {latest} is not readable"
    (log / f"{latest + 1:020d}.json").unlink()
    (tmp_path / "moved.json").rename(log / f"{latest:020d}.json")
    assert bronze_news.news(bronze, recorded) is None
    write_deltalake(str(bronze / "source_relations"), table(SOURCE_RELATIONS, relations()[:1]), mode="append")
    assert bronze_news.news(bronze, recorded) == "source_relations: new rows"


def test_main_exit_codes(tmp_path: Path, capsys: object) -> None:
    bronze_fixture.write(str(tmp_path), 1)
    bronze = tmp_path / "bronze"
    state = tmp_path / "state.json"
    assert bronze_news.main(["news", str(bronze), str(state)]) == 0  # no state yet: build
    assert bronze_news.main(["versions", str(bronze)]) == 0
    state.write_text(json.dumps(bronze_news.versions(bronze)))
    assert bronze_news.main(["news", str(bronze), str(state)]) == bronze_news.NOTHING_NEW
    assert bronze_news.main(["bogus"]) == 2
