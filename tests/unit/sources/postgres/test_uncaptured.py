"""ChangeBuilder and the source's config: tables the publication sends that the config does not list."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ingest.events import Action, ChangeEvent
from ingest.masking import MaskWith, TableMask
from ingest.sources.postgres.changes import ChangeBuilder
from ingest.sources.postgres.pgoutput import Begin, Commit, Insert, Relation, RelationColumn, Truncate, Update
from tests.unit.sources.postgres.recorded import FixtureCatalog

INT4, TEXT = 23, 25
SECRET = b"carol@secret.example"


class ConfiguredCatalog(FixtureCatalog):
    """The fixture catalog with the source's configured tables: `s.users` masks `email`."""

    def __init__(self, tables: set[str]) -> None:
        super().__init__()
        self.tables = tables

    def captures(self, relation_id: int, schema: str, table: str) -> bool:
        return f"{schema}.{table}" in self.tables

    def table_mask(self, schema: str, table: str, sent: Sequence[str], key: Sequence[str]) -> TableMask | None:
        if f"{schema}.{table}" != "s.users":
            return None
        return TableMask(frozenset(), frozenset({"email"}), MaskWith.HASH, b"s" * 16)


def _relation(relation_id: int, name: str) -> Relation:
    cols = (RelationColumn(1, "id", INT4, -1), RelationColumn(0, "email", TEXT, -1))
    return Relation(relation_id=relation_id, namespace="s", name=name, replica_identity="d", columns=cols)


def test_changes_of_a_table_left_out_of_the_config_are_dropped_and_counted() -> None:
    """A masked table removed from the config stayed published, and its changes landed unmasked."""
    cat = ConfiguredCatalog({"s.orders"})  # s.users left the config, and with it its rule
    cat.columns = {1: ["id", "email"], 2: ["id", "email"]}
    for native in (True, False):
        b = ChangeBuilder(cat, use_native=native)
        out = [b.feed(Begin(final_lsn=100, commit_ts_us=0, xid=1))]
        for msg in (_relation(1, "users"), _relation(2, "orders")):
            out.append(b.feed(msg))
        out.append(
            b.feed_payload(b"I" + (1).to_bytes(4, "big") + b"N\x00\x02t\x00\x00\x00\x011t\x00\x00\x00\x14" + SECRET)
        )
        out.append(b.feed(Update(relation_id=1, old_kind=None, old=None, new=(b"1", SECRET))))
        out.append(b.feed(Insert(relation_id=2, new=(b"7", b"order"))))
        out.append(b.feed(Truncate(options=0, relation_ids=(1, 2))))
        out.append(b.feed(Truncate(options=0, relation_ids=(1,))))
        out.append(b.feed(Commit(flags=0, commit_lsn=100, end_lsn=120, commit_ts_us=0)))
        events = [e for e in out if isinstance(e, ChangeEvent)]
        assert [(e.table_name, e.action) for e in events] == [("orders", Action.INSERT), ("orders", Action.TRUNCATE)]
        assert events[1].truncated_tables == ("s.orders",) and events[1].commit_index == 1
        assert all(SECRET.decode() not in repr(e) for e in events)
        assert b.uncaptured == {"s.users": 4}
        assert [s.table_name for s in b.new_shapes] == ["orders"]


def test_a_configured_table_is_masked() -> None:
    cat = ConfiguredCatalog({"s.users"})
    cat.columns = {1: ["id", "email"]}
    b = ChangeBuilder(cat)
    b.feed(_relation(1, "users"))
    b.feed(Begin(final_lsn=100, commit_ts_us=0, xid=1))
    ev = b.feed(Insert(relation_id=1, new=(b"1", SECRET)))
    assert isinstance(ev, ChangeEvent) and ev.record is not None
    assert json.loads(ev.record)["email"] != SECRET.decode() and b.uncaptured == {}
