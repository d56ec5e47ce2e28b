"""ChangeBuilder over recorded pgoutput: transaction framing, commit_index, keys and rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.errors import SourceError
from ingest.events import Action, ChangeEvent
from ingest.sources.postgres.changes import ChangeBuilder, TxnEnd
from ingest.sources.postgres.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Insert,
    Relation,
    RelationColumn,
    Update,
    decode,
)
from ingest.sources.postgres.values import ValueMappingError
from tests.unit.sources.postgres.recorded import FixtureCatalog, fixture


def replay(step_names: list[str] | None = None) -> list[ChangeEvent | TxnEnd]:
    cat = FixtureCatalog()
    b = ChangeBuilder(cat)
    out: list[ChangeEvent | TxnEnd] = []
    for step in fixture()["steps"]:
        if step_names and step["name"] not in step_names:
            continue
        for ch in step["changes"]:
            msg = decode(bytes.fromhex(ch["data"]))
            if isinstance(msg, Relation):
                cat.columns[msg.relation_id] = [c.name for c in msg.columns]
            r = b.feed(msg)
            if r is not None:
                out.append(r)
    return out


def test_every_transaction_numbers_its_changes_from_zero() -> None:
    out = replay()
    current: list[ChangeEvent] = []
    txns = 0
    for item in out:
        if isinstance(item, TxnEnd):
            txns += 1
            assert [e.commit_index for e in current] == list(range(len(current)))
            assert {e.commit_lsn for e in current} <= {item.commit_lsn}
            current = []
        elif item.message_transactional is not False:
            current.append(item)
    assert txns >= 10
    assert {e.action for e in out if isinstance(e, ChangeEvent)} == set(Action)


def test_rows_keys_and_old_keys() -> None:
    events = [e for e in replay() if isinstance(e, ChangeEvent)]
    inserts = [e for e in events if e.action is Action.INSERT]
    assert all(e.record_pk and e.record_pk.startswith('{"id":') for e in inserts)
    first = json.loads(inserts[0].record)  # type: ignore[arg-type]
    assert first["id"] == 1 and first["t"] == 'héllo "q" \\ \n tab\t'
    pk_changes = [e for e in events if e.action is Action.UPDATE and e.old_record_pk]
    assert pk_changes, "the fixture has a primary-key change"
    assert all(e.old_record_pk != e.record_pk for e in pk_changes)
    deletes = [e for e in events if e.action is Action.DELETE]
    assert deletes and all(e.record is None and e.old_record and e.record_pk for e in deletes)
    toasted = [e for e in events if e.unchanged_toast]
    assert toasted and all(all(c not in json.loads(e.record or "{}") for c in e.unchanged_toast or ()) for e in toasted)


def test_change_before_relation_is_an_error() -> None:
    b = ChangeBuilder(FixtureCatalog())
    b.feed(Begin(final_lsn=100, commit_ts_us=0, xid=1))
    with pytest.raises(SourceError, match="before its Relation"):
        b.feed(Insert(relation_id=42, new=(b"1",)))


def test_commit_must_match_begin() -> None:
    b = ChangeBuilder(FixtureCatalog())
    b.feed(Begin(final_lsn=100, commit_ts_us=0, xid=1))
    with pytest.raises(SourceError, match="does not match"):
        b.feed(Commit(flags=0, commit_lsn=101, end_lsn=120, commit_ts_us=0))


def test_table_without_key_or_full_identity_is_refused() -> None:
    b = ChangeBuilder(FixtureCatalog())
    rel = Relation(
        relation_id=7,
        namespace="s",
        name="t",
        replica_identity="d",
        columns=(RelationColumn(flags=0, name="x", type_oid=23, type_modifier=-1),),
    )
    with pytest.raises(SourceError, match="no primary key"):
        b.feed(rel)


INT4, TEXT, BOOL = 23, 25, 16


def builder_for(columns: list[tuple[str, int]], replica_identity: str = "d", key: bool = True) -> ChangeBuilder:
    """A builder in a transaction that knows relation 7, `s.t`, with these (name, type OID) columns.

    `key`: the catalog gives `id` as the primary key (else the table has none).
    """
    cat = FixtureCatalog()
    cat.columns[7] = [name for name, _ in columns] if key else []
    b = ChangeBuilder(cat, use_native=False)
    # The key flags as the server sets them: the identity's columns, every column under FULL.
    flag = {name: int(replica_identity == "f" or (key and name == "id")) for name, _ in columns}
    cols = tuple(RelationColumn(flag[name], name, oid, -1) for name, oid in columns)
    b.feed(Relation(relation_id=7, namespace="s", name="t", replica_identity=replica_identity, columns=cols))
    b.feed(Begin(final_lsn=100, commit_ts_us=0, xid=1))
    return b


def test_tuple_width_other_than_the_relation_is_an_error() -> None:
    """Issue 16: a tuple narrower than the cached Relation was encoded as a record missing columns.

    (A wider one raised a bare IndexError.) Either means a Relation message was missed; the stream
    must stop with a message naming the table.
    """
    b = builder_for([("id", INT4), ("name", TEXT)])
    for new in [(b"1",), (b"1", b"a", b"x")]:
        with pytest.raises(ValueMappingError, match=r"table s\.t: .* a Relation message was missed"):
            b.feed(Insert(relation_id=7, new=new))
    assert b.feed(Insert(relation_id=7, new=(b"1", b"a"))) is not None  # the right width still goes through


def test_full_identity_update_keeps_an_unchanged_toast_key_column_from_the_old_row() -> None:
    """Regression: REPLICA IDENTITY FULL update of a table with a TOASTed column crash-looped the stream.

    Without a primary key REPLICA IDENTITY FULL makes every column the key, and an UPDATE that leaves
    a TOASTed column alone sends it unchanged ('u') in the new tuple; the fix of issue 16 made that
    an error, on an ordinary update. The old row (`O`) always carries the value (flattened), and
    'u' means the new value equals it: the key takes it from there. `record` keeps the bronze
    contract of every unchanged-TOAST column: absent, and listed in `unchanged_toast`.
    """
    b = builder_for([("id", INT4), ("body", TEXT), ("n", INT4)], replica_identity="f", key=False)
    ins = b.feed(Insert(relation_id=7, new=(b"1", b"long", b"0")))
    touched = b.feed(Update(relation_id=7, old_kind="O", old=(b"1", b"long", b"0"), new=(b"1", UNCHANGED_TOAST, b"0")))
    changed = b.feed(Update(relation_id=7, old_kind="O", old=(b"1", b"long", b"0"), new=(b"1", UNCHANGED_TOAST, b"5")))
    assert isinstance(ins, ChangeEvent) and isinstance(touched, ChangeEvent) and isinstance(changed, ChangeEvent)
    assert ins.record_pk == touched.record_pk == '{"id":1,"body":"long","n":0}'
    assert touched.old_record_pk is None  # the key did not change
    # The key is the whole row: changing n changes it, and the old key is the insert's.
    assert (changed.record_pk, changed.old_record_pk) == ('{"id":1,"body":"long","n":5}', ins.record_pk)
    assert (changed.record, changed.unchanged_toast) == ('{"id":1,"n":5}', ("body",))
    assert changed.old_record == '{"id":1,"body":"long","n":0}'


def test_unchanged_toast_primary_key_comes_from_the_old_key_tuple() -> None:
    """Default identity: the old key (`K`) is sent when it holds an out-of-line value; the key takes it."""
    b = builder_for([("id", TEXT), ("n", INT4)])
    ev = b.feed(Update(relation_id=7, old_kind="K", old=(b"big", None), new=(UNCHANGED_TOAST, b"2")))
    assert isinstance(ev, ChangeEvent)
    assert (ev.record_pk, ev.old_record_pk, ev.record, ev.unchanged_toast) == ('{"id":"big"}', None, '{"n":2}', ("id",))


@pytest.mark.parametrize(
    "old_kind, old",
    [
        (None, None),  # no old tuple at all
        ("K", (b"1", None)),  # a key tuple without the column (not part of the replica identity): NULL
        ("O", (b"1", UNCHANGED_TOAST)),  # never sent (old rows are flattened), but no value either
    ],
)
def test_unchanged_toast_key_column_without_an_old_value_is_an_error(old_kind: Any, old: Any) -> None:
    """Issue 16: an unchanged-TOAST key column was written as null in `record_pk`.

    When the change carries no old value of it the key cannot be known: the stream stops with a
    message naming the table and column rather than give the change another row's identity.
    """
    b = builder_for([("id", INT4), ("body", TEXT)], replica_identity="f", key=False)
    update = Update(relation_id=7, old_kind=old_kind, old=old, new=(b"1", UNCHANGED_TOAST))
    with pytest.raises(ValueMappingError, match=r'table s\.t: key column "body" is an unchanged TOAST value'):
        b.feed(update)


def test_null_key_column_is_json_null() -> None:
    """A NULL key column (possible when REPLICA IDENTITY FULL makes every column the key) is null."""
    b = builder_for([("id", INT4), ("note", TEXT)], replica_identity="f", key=False)
    ev = b.feed(Insert(relation_id=7, new=(b"1", None)))
    assert isinstance(ev, ChangeEvent)
    assert (ev.record_pk, ev.record) == ('{"id":1,"note":null}', '{"id":1,"note":null}')


def test_value_that_does_not_map_names_table_and_column() -> None:
    b = builder_for([("id", INT4), ("ok", BOOL), ("t", TEXT)])
    with pytest.raises(ValueMappingError, match=r"table s\.t, column \"ok\": boolean value 'x'"):
        b.feed(Insert(relation_id=7, new=(b"1", b"x", b"")))
    with pytest.raises(ValueMappingError, match=r'table s\.t, column "t": .*utf-8'):
        b.feed(Insert(relation_id=7, new=(b"1", b"t", b"\xff")))
