"""pgoutput decoder against bytes recorded from PostgreSQL 15 (fixtures/pgoutput_v1.json)."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.errors import IngestError
from ingest.sources.postgres.pgoutput import (
    PG_EPOCH_OFFSET_US,
    TRUNCATE_CASCADE,
    TRUNCATE_RESTART_IDENTITY,
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputError,
    PgOutputMessage,
    Relation,
    Truncate,
    TypeInfo,
    Update,
    decode,
    pg_to_unix_us,
)
from tests.unit.sources.postgres.recorded import all_raw, fixture, messages, raw

SCHEMA = fixture()["schema"]


def relation(msgs: list[PgOutputMessage], name: str) -> Relation:
    """The Relation message of table `name` in `msgs`."""
    [rel] = [m for m in msgs if isinstance(m, Relation) and m.name == name]
    return rel


def test_every_recorded_message_decodes_and_transactions_are_framed() -> None:
    for rec in fixture()["steps"]:
        msgs = [decode(bytes.fromhex(c["data"])) for c in rec["changes"]]
        if rec["name"] == "message_nontransactional":
            assert [type(m) for m in msgs] == [LogicalMessage]
            continue
        begin, commit = msgs[0], msgs[-1]
        assert isinstance(begin, Begin) and isinstance(commit, Commit)
        assert begin.final_lsn == commit.commit_lsn
        assert commit.end_lsn > commit.commit_lsn
        assert begin.commit_ts_us == commit.commit_ts_us
        assert begin.xid == rec["changes"][0]["xid"]
        assert commit.flags == 0


def test_insert_relation_and_types() -> None:
    msgs = messages("insert_kinds")
    types = [m for m in msgs if isinstance(m, TypeInfo)]
    names = {(t.namespace, t.name) for t in types}
    assert (SCHEMA, "mood") in names and (SCHEMA, "_mood") in names
    # A domain is announced under its own OID but with its base type's name; pg_catalog is "".
    assert ("", "int4") in names
    rel = relation(msgs, "kinds")
    assert rel.namespace == SCHEMA and rel.replica_identity == "d"
    assert [c.name for c in rel.columns][:4] == ["id", "i2", "i4", "o"]
    assert [c.is_key for c in rel.columns] == [True] + [False] * (len(rel.columns) - 1)
    by_name = {c.name: c for c in rel.columns}
    assert by_name["id"].type_oid == 20 and by_name["id"].type_modifier == -1
    assert by_name["vc"].type_modifier == 10 + 4  # varchar(10): typmod = length + VARHDRSZ
    assert by_name["m"].type_oid == next(t.type_oid for t in types if t.name == "mood")

    first, second = (m for m in msgs if isinstance(m, Insert))
    assert first.relation_id == rel.relation_id
    values = dict(zip(by_name, first.new, strict=True))
    assert values["id"] == b"1"
    assert values["t"] == 'héllo "q" \\ \n tab\t'.encode()
    assert values["ch"] == b"ab "
    assert values["by"] == b"\\x000aff"
    assert values["ts"] == b"infinity"
    assert values["iv"] == b"P1Y2M3DT4H5M6S"
    assert values["ia"] == b"[0:2]={1,NULL,3}"
    assert values["boxes"] == b"{(1,1),(0,0);(3,3),(2,2)}"
    # marker 'n': every column but the key is NULL in the second row
    assert second.new == (b"2",) + (None,) * (len(rel.columns) - 1)


def test_binary_mode_marker_b_gives_raw_bytes() -> None:
    text_insert, _ = (m for m in messages("insert_kinds") if isinstance(m, Insert))
    binary_insert, _ = (m for m in messages("insert_kinds", binary=True) if isinstance(m, Insert))
    assert binary_insert.new[0] == struct.pack("!q", 1)  # int8 send format
    assert binary_insert.new[1] == struct.pack("!h", -32768)
    assert binary_insert.new[9] == text_insert.new[9]  # text sends its UTF-8 bytes either way
    assert binary_insert.new != text_insert.new


def test_update_without_old_tuple() -> None:
    [update] = [m for m in messages("update_plain") if isinstance(m, Update)]
    assert update.old_kind is None and update.old is None
    assert update.new == (b"2", b"TWO")


def test_update_changing_the_key_sends_old_key_k() -> None:
    msgs = messages("update_key")
    [update] = [m for m in msgs if isinstance(m, Update)]
    assert update.relation_id == relation(msgs, "items").relation_id
    assert update.old_kind == "K"
    assert update.old == (b"1", None)  # non-key columns of a key tuple come as NULL
    assert update.new == (b"10", b"one")


def test_update_under_replica_identity_full_sends_old_row_o() -> None:
    msgs = messages("update_full")
    rel = relation(msgs, "full_items")
    assert rel.replica_identity == "f"
    assert all(c.is_key for c in rel.columns)  # FULL flags every column
    [update] = [m for m in msgs if isinstance(m, Update)]
    assert (update.old_kind, update.old) == ("O", (b"1", b"apple", b"5"))
    assert update.new == (b"1", None, b"6")


def test_delete_key_and_full() -> None:
    [key] = [m for m in messages("delete_key") if isinstance(m, Delete)]
    assert (key.old_kind, key.old) == ("K", (b"3", None))
    [full] = [m for m in messages("delete_full") if isinstance(m, Delete)]
    assert (full.old_kind, full.old) == ("O", (b"2", b"pear", b"7"))


def test_unchanged_toast_marker_u() -> None:
    msgs = messages("update_toast_unchanged")
    assert [c.name for c in relation(msgs, "docs").columns] == ["id", "title", "body"]
    [update] = [m for m in msgs if isinstance(m, Update)]
    assert update.new == (b"1", b"renamed", UNCHANGED_TOAST)
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"


def test_truncate_single_and_cascade_restart_identity() -> None:
    msgs = messages("truncate_one")
    [one] = [m for m in msgs if isinstance(m, Truncate)]
    assert one == Truncate(0, (relation(msgs, "full_items").relation_id,))

    msgs = messages("truncate_cascade_restart")
    [many] = [m for m in msgs if isinstance(m, Truncate)]
    assert many.options == TRUNCATE_CASCADE | TRUNCATE_RESTART_IDENTITY == 3
    expected = tuple(relation(msgs, n).relation_id for n in ("parent", "items", "child"))
    assert many.relation_ids == expected  # named tables first, then the cascaded one


def test_logical_messages() -> None:
    msgs = messages("message_transactional")
    [tx] = [m for m in msgs if isinstance(m, LogicalMessage)]
    assert tx.transactional and tx.prefix == f"{SCHEMA}.tx" and tx.content == b"in a transaction"
    assert isinstance(msgs[1], LogicalMessage)  # in WAL order, before the insert
    begin = msgs[0]
    assert isinstance(begin, Begin) and tx.lsn < begin.final_lsn

    [nontx] = messages("message_nontransactional")
    assert isinstance(nontx, LogicalMessage)
    assert nontx == LogicalMessage(False, nontx.lsn, f"{SCHEMA}.nontx", b"\x00\xff\x01")


def test_origin_and_commit_timestamp() -> None:
    msgs = messages("origin")
    assert isinstance(msgs[1], Origin)
    assert msgs[1] == Origin(0x12345678, fixture()["origin"])
    commit = msgs[-1]
    assert isinstance(commit, Commit)
    # pg_replication_origin_xact_setup set the commit time to 2024-01-01 00:00:00 UTC
    assert pg_to_unix_us(commit.commit_ts_us) == 1_704_067_200 * 1_000_000
    assert pg_to_unix_us(0) == PG_EPOCH_OFFSET_US == 946_684_800_000_000


def test_memoryview_input() -> None:
    for buf in all_raw():
        assert decode(memoryview(buf)) == decode(buf)
        assert decode(memoryview(b"\0" + buf)[1:]) == decode(buf)


def test_unknown_message_type_raises_naming_the_byte() -> None:
    with pytest.raises(PgOutputError, match=r"unknown pgoutput message type b'X' \(0x58\) at offset 0"):
        decode(b"X\x00\x00")
    assert issubclass(PgOutputError, IngestError)
    with pytest.raises(PgOutputError, match="empty"):
        decode(b"")
    with pytest.raises(PgOutputError, match=r"0x50"):  # two-phase (protocol 3) is not spoken
        decode(b"P" + bytes(8))
    with pytest.raises(PgOutputError, match="trailing"):  # a Stream Start is 6 bytes
        decode(b"S" + bytes(8))


def test_every_truncation_of_every_recorded_message_raises() -> None:
    for buf in all_raw():
        for cut in range(len(buf)):
            with pytest.raises(PgOutputError):
                decode(buf[:cut])


def test_trailing_bytes_raise() -> None:
    for buf in all_raw():
        with pytest.raises(PgOutputError, match="trailing"):
            decode(buf + b"\x00")


def test_unknown_tuple_marker_raises_naming_the_byte() -> None:
    [update] = raw("update_plain")[2:3]
    assert update[:1] == b"U" and update[5:6] == b"N" and update[8:9] == b"t"
    broken = update[:8] + b"x" + update[9:]
    with pytest.raises(PgOutputError, match=r"tuple column marker b'x' \(0x78\) at offset 8"):
        decode(broken)
    with pytest.raises(PgOutputError, match="unexpected tuple kind b'Q'"):
        decode(update[:5] + b"Q" + update[6:])


@given(st.binary(max_size=64))
def test_garbage_raises_only_pgoutput_error(buf: bytes) -> None:
    with contextlib.suppress(PgOutputError):
        decode(buf)


@given(st.sampled_from(sorted(set(b[:1] for b in all_raw()))), st.binary(max_size=40))
def test_garbage_after_a_known_type_raises_only_pgoutput_error(kind: bytes, body: bytes) -> None:
    with contextlib.suppress(PgOutputError):
        decode(kind + body)
