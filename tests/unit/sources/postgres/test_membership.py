"""Publication membership tokens (membership.py) and how bronze keeps them (source_relations.publication_membership).

Pins the hole where a table dropped from the publication and added back lost its changes in
between unnoticed: a membership that shares no publication row with the recorded one is a loss,
one that keeps a row is not, and the recorded membership survives rows that say nothing of it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.bronze.schemas import SOURCE_RELATIONS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.events import ColumnShape, RelationShape
from ingest.sources.postgres.membership import decode, encode, membership_lost


def shape(lsn: int, columns: tuple[str, ...] = ("id",)) -> RelationShape:
    cols = tuple(
        ColumnShape(c, 23, "integer", -1, i == 0, 1 if i == 0 else None, "int", i + 1) for i, c in enumerate(columns)
    )
    return RelationShape(16384, "public", "t", "d", cols, lsn)


def test_tokens_are_sorted_and_read_back() -> None:
    assert encode(frozenset({"rel:20", "ns:3", "all:7"})) == "all:7,ns:3,rel:20"
    assert decode("all:7,ns:3,rel:20") == frozenset({"rel:20", "ns:3", "all:7"})
    assert encode(frozenset()) == ""
    assert decode("") == frozenset()


@pytest.mark.parametrize(
    ("recorded", "found", "lost"),
    [
        (None, {"rel:2"}, False),  # unknown (an older ingest's rows): recorded now, nothing lost
        ({"rel:1"}, {"rel:1"}, False),
        ({"rel:1"}, {"rel:2"}, True),  # dropped and added back: a new row
        ({"rel:1"}, set(), True),  # dropped and not back
        (set(), {"rel:2"}, True),  # recorded out of the publication, back now
        (set(), set(), False),  # still out, as recorded
        ({"rel:1"}, {"rel:1", "ns:5"}, False),  # gained its schema's membership
        ({"rel:1", "ns:5"}, {"ns:5", "rel:9"}, False),  # its own row replaced while the schema's kept it
        ({"all:4"}, {"all:8"}, True),  # an all-tables publication dropped and created again
    ],
)
def test_a_membership_is_lost_only_when_no_row_stayed(recorded: set[str] | None, found: set[str], lost: bool) -> None:
    assert membership_lost(None if recorded is None else frozenset(recorded), frozenset(found)) is lost


def test_bronze_keeps_the_latest_recorded_membership_across_rows_without_one(tmp_path: Path) -> None:
    """The stream's shape rows carry no membership: they must not make a recorded one unknown again."""
    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    key = ("public", "t")
    writer.append_relations("s", [shape(100)], {key: "rel:1"})
    writer.append_relations("s", [shape(200, ("id", "v"))])  # met by the stream
    assert writer.known_memberships("s") == {key: "rel:1"}
    writer.append_relations("s", [shape(300, ("id", "v"))], {key: "rel:2"})  # membership alone changed
    writer.append_relations("s", [shape(400)], {key: ""})
    assert writer.known_memberships("s") == {key: ""}
    assert writer.known_memberships("other") == {}
    history = [sh.shape_hash for sh, _ in writer.shape_history("s")]
    assert history[1] == history[2], "a membership-only row keeps the table's shape"


def test_an_older_source_relations_table_gains_the_column_and_reads_as_unknown(tmp_path: Path) -> None:
    uri = tmp_path / "bronze" / "source_relations"
    schema = SOURCE_RELATIONS_TABLE.schema
    old_schema = schema.remove(schema.get_field_index("publication_membership"))
    old_row = {name: None for name in old_schema.names} | {
        "source": "s",
        "table_schema": "public",
        "table_name": "t",
        "columns": [],
        "first_seen_lsn": 1,
    }
    write_deltalake(str(uri), pa.Table.from_pylist([old_row], old_schema), partition_by=["source"])

    writer = BronzeWriter(tmp_path)
    writer.ensure_tables()
    assert "publication_membership" in pa.schema(DeltaTable(str(uri)).schema().to_arrow()).names
    assert writer.known_memberships("s") == {}
    writer.append_relations("s", [shape(5)], {("public", "t"): "rel:3"})
    assert writer.known_memberships("s") == {("public", "t"): "rel:3"}
