"""Protocol 2 streaming: the stream messages decode, and streamed transactions reassemble into protocol 1.

The fixture (record_streaming.py) holds one workload read from PostgreSQL 15 through two slots,
as protocol 2 streams it (logical_decoding_work_mem 64 kB: a large transaction with a savepoint
rolled back inside, a small one of another session committed meanwhile, a large one aborted) and
as protocol 1 sends it. Reassembled, the streamed messages are protocol 1's byte for byte, held
in memory or spilled to a file alike.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ingest.bronze import pending
from ingest.bronze.committer import Batch
from ingest.bronze.writer import wal_rows
from ingest.capture.batcher import Resume, TransactionBatcher
from ingest.config import BatchConfig
from ingest.errors import SourceError
from ingest.events import Action, ChangeEvent
from ingest.sources.postgres import native, streamed
from ingest.sources.postgres.changes import ChangeBuilder, TxnEnd
from ingest.sources.postgres.inflight import EarlyCatalog, InflightTransaction
from ingest.sources.postgres.pgoutput import (
    MSG_RELATION,
    Begin,
    Commit,
    Insert,
    PgOutputError,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    decode,
    decode_streamed,
    unstream,
)
from ingest.sources.postgres.streamed import DecodedTransaction, StreamedTransactions
from tests.unit.sources.postgres.recorded import FixtureCatalog

FIXTURE = Path(__file__).with_name("fixtures") / "pgoutput_v2_streaming.json"


@cache
def recorded(proto: str) -> list[tuple[int, bytes]]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    out = []
    for c in data[proto]:
        hi, lo = c["lsn"].split("/")
        out.append(((int(hi, 16) << 32) | int(lo, 16), bytes.fromhex(c["data"])))
    return out


def reassembled(spill_bytes: int) -> list[bytes]:
    """The protocol 2 recording through StreamedTransactions: what the replication stream hands on."""
    streamed = StreamedTransactions(spill_bytes)
    out: list[bytes] = []
    for lsn, payload in recorded("v2"):
        if not streamed.takes(payload):
            out.append(payload)
            continue
        replay = streamed.take(lsn, payload)
        if replay is not None:
            out += list(replay)
    assert streamed.oldest_start() is None, "every streamed transaction ended"
    return out


def without_relations(payloads: list[bytes]) -> list[bytes]:
    # Protocol 2 sends a table's Relation again in each streamed transaction and in the next plain
    # one; the shapes are the same (the builder records a shape once per change of it).
    return [p for p in payloads if p[:1] != MSG_RELATION]


def test_the_recording_streams() -> None:
    """The fixture exercises what it should: chunks, a subtransaction abort, a whole abort, a commit."""
    kinds = {p[:1] for _, p in recorded("v2")}
    assert {b"S", b"E", b"c", b"A"} <= kinds
    aborts = [decode(p) for _, p in recorded("v2") if p[:1] == b"A"]
    assert any(isinstance(a, StreamAbort) and a.subxid != a.xid for a in aborts), "a savepoint rolled back"
    assert any(isinstance(a, StreamAbort) and a.subxid == a.xid for a in aborts), "a transaction aborted"


def test_stream_messages_decode_from_real_bytes() -> None:
    """Stream Start/Stop/Commit/Abort and the xid-prefixed changes decode; the commit matches protocol 1's."""
    starts, commits, in_block = [], [], False
    for _, payload in recorded("v2"):
        if in_block and payload[:1] not in (b"E",):
            xid, msg = decode_streamed(payload)
            assert xid > 0 and not isinstance(msg, StreamStart | StreamCommit)
            continue
        msg = decode(payload)
        if isinstance(msg, StreamStart):
            starts.append(msg)
            in_block = True
        elif isinstance(msg, StreamStop):
            in_block = False
        elif isinstance(msg, StreamCommit):
            commits.append(msg)
    assert starts[0].first_segment and not all(s.first_segment for s in starts), "several chunks"
    [commit] = commits
    v1 = [decode(p) for _, p in recorded("v1")]
    begins = {m.xid: m for m in v1 if isinstance(m, Begin)}
    ends = {m.commit_lsn: m for m in v1 if isinstance(m, Commit)}
    assert begins[commit.xid].final_lsn == commit.commit_lsn
    assert begins[commit.xid].commit_ts_us == commit.commit_ts_us
    assert ends[commit.commit_lsn].end_lsn == commit.end_lsn


@pytest.mark.parametrize("spill_bytes", [64 * 1024 * 1024, 1])
def test_streamed_transactions_reassemble_into_protocol_1(spill_bytes: int) -> None:
    """Held in memory or spilled to a file: the same messages protocol 1 sends, aborted (sub)transactions gone."""
    assert without_relations(reassembled(spill_bytes)) == without_relations([p for _, p in recorded("v1")])


def test_reassembled_stream_builds_protocol_1_events() -> None:
    """The change builder makes the same events of both (commit_lsn, commit_index, rows)."""

    class Catalog(FixtureCatalog):
        def record_key(self, relation_id: int) -> list[str]:
            return ["id"]

    def events(payloads: list[bytes]) -> list[Any]:
        builder = ChangeBuilder(Catalog(), use_native=False)
        return [e for e in map(builder.feed_payload, payloads) if e is not None]

    v1 = events([p for _, p in recorded("v1")])
    assert len(v1) > 800
    assert events(reassembled(1)) == v1


def _start(xid: int, first: bool = True) -> bytes:
    return b"S" + struct.pack("!IB", xid, int(first))


def _insert(xid: int, row_id: int) -> bytes:
    value = str(row_id).encode()
    return b"I" + struct.pack("!IIch", xid, 7, b"N", 1) + b"t" + struct.pack("!i", len(value)) + value


def _commit(xid: int) -> bytes:
    return b"c" + struct.pack("!IBQQq", xid, 0, 500, 600, 42)


def test_a_subtransaction_abort_drops_only_its_changes() -> None:
    """Stream Abort of a subxid drops its changes, spilled or held; the top-level's and others' stay."""
    for spill in (1 << 20, 1):
        s = StreamedTransactions(spill)
        for p in (_start(10), _insert(10, 1), _insert(11, 2), _insert(12, 3), b"E"):
            assert s.take(100, p) is None
        assert s.oldest_start() == 100
        assert s.take(200, b"A" + struct.pack("!II", 10, 11)) is None
        out = list(s.take(300, _commit(10)) or [])
        assert [decode(p) for p in out[1:-1]] == [Insert(7, (b"1",)), Insert(7, (b"3",))]
        assert decode(out[0]) == Begin(500, 42, 10) and decode(out[-1]) == Commit(0, 500, 600, 42)
        assert s.oldest_start() is None


def test_a_spilled_transaction_reads_back_across_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Written in segments of a few changes, a subtransaction aborted after some were written: the same order."""
    monkeypatch.setattr(streamed, "SEGMENT_ITEMS", 3)
    rows = range(20)
    blocks = [_start(10), *(_insert(11 if i % 4 == 1 else 10, i) for i in rows), b"E"]
    for spill in (1 << 20, 1):
        s = StreamedTransactions(spill)
        for p in blocks:
            s.take(100, p)
        s.take(200, b"A" + struct.pack("!II", 10, 11))
        out = list(s.take(300, _commit(10)) or [])
        assert [decode(p) for p in out[1:-1]] == [Insert(7, (str(i).encode(),)) for i in rows if i % 4 != 1]


def test_a_spill_file_cut_short_is_an_error() -> None:
    s = StreamedTransactions(1)
    for p in (_start(10), *(_insert(10, i) for i in range(5)), b"E"):
        s.take(100, p)
    txn = s._open[10]
    txn._write_segment()
    assert txn.spill is not None
    txn.spill.flush()
    txn.spill.truncate(txn.spill.tell() - 3)  # the local disk lost the file's end
    with pytest.raises(SourceError, match="ended early or is damaged"):
        list(s.take(300, _commit(10)) or [])


def test_a_top_level_abort_drops_the_transaction() -> None:
    s = StreamedTransactions()
    for p in (_start(10), _insert(10, 1), b"E", _start(20), _insert(20, 2), b"E"):
        s.take(100 if p[1:5] == b"\0\0\0\n" else 150, p)
    s.take(200, b"A" + struct.pack("!II", 10, 10))
    assert s.oldest_start() == 150
    with pytest.raises(SourceError, match="streamed none of it"):
        s.take(300, _commit(10))


def test_a_later_chunk_of_an_unknown_transaction_is_refused() -> None:
    with pytest.raises(SourceError, match="first chunk"):
        StreamedTransactions().take(100, _start(10, first=False))


def test_unstream_refuses_messages_without_an_xid() -> None:
    assert unstream(_insert(9, 1)) == (9, b"I" + _insert(9, 1)[5:])
    with pytest.raises(PgOutputError, match="carries no xid"):
        unstream(b"B" + b"\0" * 20)
    with pytest.raises(PgOutputError, match="no xid"):
        unstream(b"I\0\0")


def test_the_compiled_decoder_reads_streamed_changes_as_python_does() -> None:
    """RowEncoder.change_streamed == (xid, change of the message without it), on every recorded streamed change."""
    catalog = FixtureCatalog()
    encoder = None
    checked = 0
    in_block = False
    for _, payload in recorded("v2"):
        kind = payload[:1]
        if kind in (b"S", b"E"):
            in_block = kind == b"S"
            continue
        if not in_block:
            continue
        xid, msg = decode_streamed(payload)
        if isinstance(msg, Relation):
            catalog.columns[msg.relation_id] = [c.name for c in msg.columns]
            builder = ChangeBuilder(catalog, use_native=True)
            builder.feed(msg)
            encoder = builder._rels[msg.relation_id].native._enc  # the compiled RowEncoder, unguarded
        elif kind in (b"I", b"U", b"D"):
            assert encoder is not None
            assert encoder.change_streamed(payload) == (xid, *encoder.change(unstream(payload)[1]))
            checked += 1
    assert native.available() and checked > 100


# -- decoded as they arrive (inflight.py) ------------------------------------------------------


class _KeyedCatalog(FixtureCatalog):
    def record_key(self, relation_id: int) -> list[str]:
        return ["id"]


class _Sink:
    """The committer as the batcher sees it: takes batches, never durable."""

    durable_lsn = 0
    ack_lsn = 0

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    def submit(self, batch: Batch) -> None:
        self.batches.append(batch)

    def drain(self) -> None:
        pass


def _decoders(configured: bool = True, spill_bytes: int = 1 << 30) -> Callable[[int], InflightTransaction]:
    early = EarlyCatalog(_KeyedCatalog(), lambda table: configured)
    return lambda xid: InflightTransaction(early, xid, spill_bytes=spill_bytes)


def _stream(
    spill_bytes: int, decoders: Callable[[int], InflightTransaction] | None
) -> Iterator[bytes | DecodedTransaction]:
    """The protocol 2 recording as the replication stream hands it on, one at a time (as it is read)."""
    s = StreamedTransactions(spill_bytes, inflight=decoders)
    for lsn, payload in recorded("v2"):
        if not s.takes(payload):
            yield payload
            continue
        replay = s.take(lsn, payload)
        if replay is not None:
            yield from replay
    assert s.oldest_start() is None, "every streamed transaction ended"


def _land(
    items: Iterable[bytes | DecodedTransaction],
    batch: BatchConfig,
    resume: Resume | None = None,
    decoded: list[DecodedTransaction] | None = None,
) -> list[Batch]:
    """What capture's loop hands the committer for these messages (no clock: batches cut by size only)."""
    sink = _Sink()
    batcher = TransactionBatcher(sink, batch, resume or Resume(0))
    builder = ChangeBuilder(_KeyedCatalog())
    for item in items:
        if isinstance(item, DecodedTransaction):
            assert builder.in_txn
            batcher.add_rows(item.rows, item.commit_lsn, item.xid, item.commit_ts_us, 0.0)
            if decoded is not None:
                decoded.append(item)
            continue
        out = builder.feed_payload(item)
        if isinstance(out, TxnEnd):
            batcher.end_transaction(out.commit_lsn, out.end_lsn, 0.0)
        elif out is not None:
            assert builder.in_txn, "the recording has no message outside a transaction"
            batcher.add(out, 0.0)
    if batcher.has_work:
        batcher.submit()
    return sink.batches


def _landed(batches: list[Batch]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The batches' cuts (size, durable position, page or not) and their wal_events rows but ingest time."""
    cuts = [(b.count, b.durable_lsn, b.mid_transaction) for b in batches]
    rows = []
    for b in batches:
        table = wal_rows("src", "postgres", "stream", b.events, b.end_lsns, b.rows).drop_columns(["ingested_at"])
        rows += sorted(table.to_pylist(), key=lambda r: (r["commit_lsn"], r["commit_index"]))
    return cuts, rows


@pytest.mark.parametrize("spill_bytes", [64 * 1024 * 1024, 1], ids=["held", "spilled"])
@pytest.mark.parametrize("max_events", [100_000, 97], ids=["whole", "paged"])
@pytest.mark.parametrize("batch_rows", [pending.BATCH_ROWS, 50], ids=["open", "batched"])
def test_decoded_as_they_arrive_the_rows_and_pages_are_protocol_1s(
    spill_bytes: int, max_events: int, batch_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded per chunk and stamped at the commit: protocol 1's rows, cut into the same pages.

    Pins that a streamed transaction's rows are decoded before its commit (a DecodedTransaction
    is handed on, not its changes), that the aborted savepoint's rows are gone (still being
    collected when it aborts, or already in record batches held or spilled), and that paging
    behind the safe bound cuts where protocol 1's cuts (same end_lsn, durable positions).
    """
    monkeypatch.setattr(pending, "BATCH_ROWS", batch_rows)
    batch = BatchConfig(max_events=max_events)
    decoded: list[DecodedTransaction] = []
    want = _landed(_land([p for _, p in recorded("v1")], batch))
    got = _landed(_land(_stream(1, _decoders(spill_bytes=spill_bytes)), batch, decoded=decoded))
    assert len(want[1]) > 800 and any(mid for _, _, mid in want[0]) == (max_events < 1000)
    assert got == want
    [txn] = decoded
    assert txn.rows.rows > 800 and bool(txn.rows._spilled_parts) == (spill_bytes == 1)


def test_rows_a_restart_already_put_in_bronze_are_skipped() -> None:
    """Re-delivered after a crash that left pages of it in bronze: only the rest is appended, as protocol 1 does."""
    batch = BatchConfig(max_events=97)
    _, everything = _landed(_land([p for _, p in recorded("v1")], batch))
    big = max({r["commit_lsn"] for r in everything}, key=lambda lsn: sum(r["commit_lsn"] == lsn for r in everything))
    resume = Resume(0, (big, 300))
    want = _landed(_land([p for _, p in recorded("v1")], batch, resume))
    got = _landed(_land(_stream(1, _decoders()), batch, resume))
    assert got == want
    assert {(r["commit_lsn"], r["commit_index"]) for r in got[1]} == {
        (r["commit_lsn"], r["commit_index"]) for r in everything if (r["commit_lsn"], r["commit_index"]) > (big, 300)
    }


def test_a_transaction_it_may_not_decode_early_is_decoded_at_its_commit() -> None:
    """A table the config does not name (or a user type, or rules) sends the transaction to the held messages."""
    items = list(_stream(1, _decoders(configured=False)))
    assert not any(isinstance(i, DecodedTransaction) for i in items)
    assert items == reassembled(1)


def _relation(xid: int) -> bytes:
    return (
        b"R"
        + struct.pack("!II", xid, 7)
        + b"public\0items\0d"
        + struct.pack("!h", 1)
        + b"\x01id\0"
        + struct.pack("!Ii", 23, -1)
    )


def _stop() -> bytes:
    return b"E"


def test_interleaved_transactions_and_an_aborted_subtransaction_decode_apart() -> None:
    """Two transactions' chunks interleaved, a savepoint of one rolled back after its rows were decoded."""
    s = StreamedTransactions(inflight=_decoders())
    chunks = [
        (_start(10), _relation(10), _insert(10, 1), _stop()),
        (_start(20), _relation(20), _insert(20, 100), _stop()),
        (_start(10, first=False), _insert(11, 2), _insert(10, 3), _stop()),
    ]
    for chunk in chunks:
        for p in chunk:
            assert s.take(100, p) is None
    assert s.take(200, b"A" + struct.pack("!II", 10, 11)) is None
    got = {}
    for xid in (20, 10):
        replay = s.take(300, _commit(xid))
        assert replay is not None
        begin, relation, decoded = next(replay), next(replay), next(replay)
        assert decode(begin) == Begin(500, 42, xid) and isinstance(decode(relation), Relation)
        assert isinstance(decoded, DecodedTransaction) and decoded.xid == xid
        got[xid] = [r["record"] for b in decoded.rows.batches() for r in b.to_pylist()]
        assert decode(next(replay)) == Commit(0, 500, 600, 42)
        assert next(replay, None) is None and decoded.rows._file is None
    assert got == {20: ['{"id":100}'], 10: ['{"id":1}', '{"id":3}']}
    assert s.oldest_start() is None


def test_a_decoded_rows_file_cut_short_is_an_error() -> None:
    """The spilled decoded rows, damaged on the local disk: a SourceError saying to run again, not rows lost."""
    rows = pending.PendingRows(spill_bytes=1)
    early = _decoders()(10)
    early.builder.feed(decode(_relation(10)[:1] + _relation(10)[5:]))
    for i in range(3):
        rows.add(10, early.builder.feed_payload(_insert(10, i)[:1] + _insert(10, i)[5:]))  # type: ignore[arg-type]
        rows.add(11, early.builder.feed_payload(_insert(11, i)[:1] + _insert(11, i)[5:]))  # type: ignore[arg-type]
    rows._flush()
    assert rows._file is not None and rows._writer is not None
    rows._writer.close()
    rows._writer = None
    rows._file.flush()
    rows._file.truncate(rows._file.tell() - 50)  # the local disk lost the file's end
    with pytest.raises(SourceError, match="ended early or is damaged"):
        list(rows.batches())
    rows.close()


def test_wide_rows_of_an_uncommitted_transaction_are_batched_by_size() -> None:
    """Rows of 1 MiB wait in record batches of about pending.BATCH_CHARS, not in one list of every event.

    A transaction updating 2,000 rows of 1 MiB held all 2,000 decoded events, then copied them into
    one record batch at its commit (4.3 GiB of peak RSS for 2 GiB of values: bench/wide_rows_rss.py
    --random-values); each batch now ends once its texts reach BATCH_CHARS, and the rows come back
    whole and in order.
    """
    width = 1 << 20
    rows = pending.PendingRows(spill_bytes=16 * width)
    values = [f'{{"id":{i},"v":"{chr(97 + i % 26) * width}"}}' for i in range(40)]
    most_unbatched = 0
    for i, value in enumerate(values):
        rows.add(7, ChangeEvent(0, 0, 7, 0, Action.UPDATE, "public", "wide", 1, f'{{"id":{i}}}', None, value))
        most_unbatched = max(most_unbatched, rows.unbatched_chars)
    assert most_unbatched <= pending.BATCH_CHARS + len(values[0]), most_unbatched
    batches = list(rows.batches())
    assert len(batches) >= len(values) * width // pending.BATCH_CHARS
    assert all(b.nbytes <= pending.BATCH_CHARS + 2 * width for b in batches), [b.nbytes for b in batches]
    assert [r for b in batches for r in b.column("record").to_pylist()] == values
    assert rows.spilled  # past spill_bytes the batches went to the file, as before
    rows.close()
