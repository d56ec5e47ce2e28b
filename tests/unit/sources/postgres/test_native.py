"""The compiled row decoder (native/) gives exactly what the Python decoder gives, or hands the message back.

Both paths run on the same bytes: the recorded pgoutput of the real server (every type, TOAST,
REPLICA IDENTITY FULL, key changes) and random rows of random scalar relations. `make setup` builds
the extension; its absence is a failure here, not a skip.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from ingest.events import ChangeEvent
from ingest.sources.postgres import native
from ingest.sources.postgres.changes import ChangeBuilder
from ingest.sources.postgres.pgoutput import UNCHANGED_TOAST, Relation, Update, decode
from tests.unit.sources.postgres.recorded import FixtureCatalog, fixture

# Scalar types and how to draw a value's text for each (as the server prints it).
INT8, FLOAT8, BOOL, TEXT, NUMERIC, JSONB, TIMESTAMPTZ, INT4_ARRAY = 20, 701, 16, 25, 1700, 3802, 1184, 1007
TEXTS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
VALUE_TEXT = {
    INT8: st.integers(-(2**63), 2**63 - 1).map(str),
    FLOAT8: st.one_of(st.floats().map(repr), st.sampled_from(["NaN", "Infinity", "-Infinity", "1e+300", "-0"])),
    BOOL: st.sampled_from(["t", "f"]),
    TEXT: TEXTS,
    NUMERIC: st.decimals(allow_nan=False, allow_infinity=False).map(str),
    JSONB: TEXTS.map(lambda s: json.dumps({"k": s})),
    TIMESTAMPTZ: st.just("2024-01-02 03:04:05.123456+00"),
}


def test_the_extension_is_installed() -> None:
    assert native.available(), "make setup builds native/ (pip install ./native)"


def relation_bytes(rid: int, names: list[str], oids: list[int], key: list[bool], ident: str = "d") -> bytes:
    out = b"R" + struct.pack("!I", rid) + b"s\0" + b"t\0" + ident.encode() + struct.pack("!h", len(names))
    for name, oid, is_key in zip(names, oids, key, strict=True):
        out += struct.pack("!B", 1 if is_key else 0) + name.encode() + b"\0" + struct.pack("!Ii", oid, -1)
    return out


def tuple_bytes(values: list[Any]) -> bytes:
    out = struct.pack("!h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "\x00toast":
            out += b"u"
        else:
            data = v.encode()
            out += b"t" + struct.pack("!i", len(data)) + data
    return out


class KeyCatalog(FixtureCatalog):
    """Type mappings of the recorded server; the key is the relation's first column."""

    def record_key(self, relation_id: int) -> list[str]:
        return self.columns[relation_id][:1]


class NoKeyCatalog(FixtureCatalog):
    """Type mappings of the recorded server; no table has a primary key (REPLICA IDENTITY FULL: all columns)."""

    def record_key(self, relation_id: int) -> list[str]:
        return []


def refuses(builder: ChangeBuilder, payload: bytes) -> bool:
    """Whether the builder's compiled decoder hands `payload` back to Python (False if none takes it)."""
    if payload[:1] not in (b"I", b"U", b"D"):
        return False
    rel = builder._rels.get(struct.unpack_from("!I", payload, 1)[0])
    if rel is None or rel.native is None:
        return False
    try:
        rel.native.change(payload)
    except ValueError:
        return True
    return False


def both_paths(
    payloads: list[bytes], catalog: Any, native_used: list[int] | None = None, refused: list[bool] | None = None
) -> tuple[list[Any], list[Any]]:
    """Feed `payloads` to a builder with the compiled decoder and to one without; their outputs.

    `native_used` receives the relation ids the first builder decodes with the compiled decoder;
    `refused`, one entry per payload: whether the compiled decoder handed it back to Python.
    """
    outs: list[list[Any]] = [[], []]
    builders = [ChangeBuilder(catalog, use_native=True), ChangeBuilder(catalog, use_native=False)]
    for p in payloads:
        if p[:1] == b"R":
            msg = decode(p)
            assert isinstance(msg, Relation)
            catalog.columns[msg.relation_id] = [c.name for c in msg.columns]
        if refused is not None:
            refused.append(refuses(builders[0], p))
        for i, b in enumerate(builders):
            try:
                outs[i].append(b.feed_payload(p) if i == 0 else b.feed(decode(p)))
            except Exception as e:  # noqa: BLE001 - both paths must fail the same way
                outs[i].append(("error", type(e).__name__, str(e)))
    if native_used is not None:
        native_used += [rid for rid, rel in builders[0]._rels.items() if rel.native is not None]
    return outs[0], outs[1]


def test_recorded_server_output_is_decoded_identically() -> None:
    payloads = [bytes.fromhex(ch["data"]) for step in fixture()["steps"] for ch in step["changes"]]
    used: list[int] = []
    fast, slow = both_paths(payloads, FixtureCatalog(), used)
    assert fast == slow
    events = [e for e in fast if isinstance(e, ChangeEvent) and e.record_pk is not None]
    assert len(events) >= 10 and any(e.relation_id in used for e in events)


def test_relations_with_array_columns_keep_the_python_path() -> None:
    b = ChangeBuilder(KeyCatalog(), use_native=True)
    b.catalog.columns[1] = ["id", "a"]  # type: ignore[attr-defined]
    b.feed(decode(relation_bytes(1, ["id", "a"], [INT8, INT4_ARRAY], [True, False])))
    b.catalog.columns[2] = ["id"]  # type: ignore[attr-defined]
    b.feed(decode(relation_bytes(2, ["id"], [INT8], [True])))
    assert b._rels[1].native is None and b._rels[2].native is not None


@st.composite
def scenario(draw: Any) -> tuple[list[bytes], bool]:
    """A relation and changes of it; some rows break a rule both paths must enforce alike.

    Rare rows have a NULL or unchanged-TOAST key column, or one column too few or too many (a
    missed Relation message). An update's new row may have unchanged-TOAST key columns whose value
    its old tuple (`K` or `O`) carries (the key takes it from there) or does not (NULL there, or
    no old tuple: an error). Returns the payloads and whether the table has no primary key
    (REPLICA IDENTITY FULL, so every column is part of the key).
    """
    n = draw(st.integers(1, 6))
    oids = [INT8] + draw(st.lists(st.sampled_from(list(VALUE_TEXT)), min_size=n - 1, max_size=n - 1))
    names = [f"c{i}" + draw(st.sampled_from(["", '"q"', "é", "\\", " x"])) for i in range(n)]
    if len(set(names)) != n:
        names = [f"{name}_{i}" for i, name in enumerate(names)]

    def row(key: int, toast: bool = False) -> list[Any]:
        first = draw(st.sampled_from(["value"] * 8 + ["null", "toast"]))
        vals: list[Any] = [str(key) if first == "value" else None if first == "null" else "\x00toast"]
        for oid in oids[1:]:
            choice = draw(st.sampled_from(["value", "null", "toast"] if toast else ["value", "null"]))
            vals.append(draw(VALUE_TEXT[oid]) if choice == "value" else None if choice == "null" else "\x00toast")
        width = draw(st.sampled_from(["same"] * 10 + ["short", "long"]))
        return vals[:-1] if width == "short" else vals + ["1"] if width == "long" else vals

    ident = draw(st.sampled_from(["d", "f"]))
    no_key = ident == "f" and draw(st.booleans())
    relation = relation_bytes(9, names, oids, [True] + [no_key] * (n - 1), ident)
    payloads = [b"B" + struct.pack("!QqI", 1000, 0, 7), relation]
    for _ in range(draw(st.integers(1, 8))):
        key = draw(st.integers(-5, 5))
        op = draw(st.sampled_from("IUUD"))
        if op == "I":
            payloads.append(b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(row(key)))
        elif op == "U":
            old = draw(st.sampled_from(["", "K", "O"]))
            head = b"U" + struct.pack("!I", 9)
            if old == "K":
                head += b"K" + tuple_bytes([str(draw(st.integers(-5, 5)))] + [None] * (n - 1))
            elif old == "O":
                head += b"O" + tuple_bytes(row(key))
            payloads.append(head + b"N" + tuple_bytes(row(key, toast=True)))
        else:
            payloads.append(b"D" + struct.pack("!I", 9) + draw(st.sampled_from([b"K", b"O"])) + tuple_bytes(row(key)))
    return payloads, no_key


@settings(max_examples=300, deadline=None)
@given(scenario())
def test_random_rows_are_decoded_identically(case: tuple[list[bytes], bool]) -> None:
    payloads, no_key = case
    used: list[int] = []
    refused: list[bool] = []
    fast, slow = both_paths(payloads, NoKeyCatalog() if no_key else KeyCatalog(), used, refused)
    assert fast == slow and used == [9]
    # The compiled decoder hands back exactly the changes Python refuses (width, unchanged-TOAST
    # key), and those fail with the error that names the problem.
    errors = [isinstance(out, tuple) and out[0] == "error" for out in slow]
    assert refused == errors
    assert all(
        "a Relation message was missed" in out[2] or "unchanged TOAST" in out[2]
        for out, error in zip(slow, errors, strict=True)
        if error
    )


def key_from_old_tuple(payload: bytes, no_key: bool, old_kind: bytes) -> bool:
    """Whether `payload` is an update with an `old_kind` old tuple that carries the value of a key column
    its new row sends as unchanged TOAST (both tuples as wide as the new one)."""
    if payload[:1] != b"U" or payload[5:6] != old_kind:
        return False
    msg = decode(payload)
    assert isinstance(msg, Update) and msg.old is not None
    if len(msg.old) != len(msg.new):
        return False
    keys = range(len(msg.new)) if no_key else range(min(1, len(msg.new)))  # a "short" row may have no column
    return any(msg.new[i] is UNCHANGED_TOAST and isinstance(msg.old[i], bytes) for i in keys)


def test_an_update_of_rows_without_columns_has_no_key_from_the_old_tuple() -> None:
    """The scenarios' short rows of a one-column relation have no column: no key to take (regression: the
    predicate indexed the key column and failed the search with an IndexError)."""
    empty = b"U" + struct.pack("!I", 9) + b"O" + struct.pack("!H", 0) + b"N" + struct.pack("!H", 0)
    assert not key_from_old_tuple(empty, False, b"O") and not key_from_old_tuple(empty, True, b"O")


@pytest.mark.parametrize("old_kind", [b"K", b"O"])
def test_random_rows_include_unchanged_toast_keys_the_compiled_decoder_takes_from_the_old_tuple(
    old_kind: bytes,
) -> None:
    """The property test above is meaningful for the REPLICA IDENTITY FULL TOAST fix: its scenarios
    include updates whose unchanged-TOAST key column the old tuple carries, and the compiled decoder
    decodes them (does not hand them back) to the same event as Python."""

    def reaches(case: tuple[list[bytes], bool]) -> bool:
        payloads, no_key = case
        refused: list[bool] = []
        fast, slow = both_paths(payloads, NoKeyCatalog() if no_key else KeyCatalog(), refused=refused)
        return (
            any(
                key_from_old_tuple(p, no_key, old_kind) and not refused[j] and isinstance(fast[j], ChangeEvent)
                for j, p in enumerate(payloads)
            )
            and fast == slow
        )

    payloads, no_key = find(scenario(), reaches, settings=settings(max_examples=5000, database=None, deadline=None))
    assert any(key_from_old_tuple(p, no_key, old_kind) for p in payloads)


def test_unchanged_toast_key_from_the_old_tuple_is_decoded_by_the_compiled_decoder() -> None:
    """REPLICA IDENTITY FULL, no primary key: an update leaving a TOASTed column alone (regression)."""
    cat = NoKeyCatalog()
    relation = relation_bytes(9, ["id", "body"], [INT8, TEXT], [True, True], "f")
    begin = b"B" + struct.pack("!QqI", 1000, 0, 7)
    update = b"U" + struct.pack("!I", 9) + b"O" + tuple_bytes(["1", "long"]) + b"N" + tuple_bytes(["1", "\x00toast"])
    refused: list[bool] = []
    fast, slow = both_paths([begin, relation, update], cat, refused=refused)
    assert fast == slow and refused == [False, False, False]
    ev = fast[-1]
    assert isinstance(ev, ChangeEvent)
    assert (ev.record_pk, ev.old_record_pk, ev.record, ev.unchanged_toast) == (
        '{"id":1,"body":"long"}',
        None,
        '{"id":1}',
        ("body",),
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(["1", "x"]),  # bool neither t nor f
        b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(["1", "t"]) + b"\0",  # trailing byte
        b"I" + struct.pack("!I", 9) + b"N" + struct.pack("!h", 2) + b"n" + b"t" + struct.pack("!i", 99) + b"t",
        b"I" + struct.pack("!I", 9) + b"N" + struct.pack("!h", 2) + b"n" + b"x",  # unknown marker
        b"I" + struct.pack("!I", 9) + b"X" + tuple_bytes(["1", "t"]),  # unknown tuple kind
        b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(["\xff", "t"]),  # not a number (not ASCII)
        b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(["1"]),  # narrower than the relation
        b"I" + struct.pack("!I", 9) + b"N" + tuple_bytes(["1", "t", "t"]),  # wider than the relation
        b"U" + struct.pack("!I", 9) + b"N" + tuple_bytes(["\x00toast", "t"]),  # unchanged-TOAST key, no old
        # unchanged-TOAST key whose old key tuple does not carry it
        b"U" + struct.pack("!I", 9) + b"K" + tuple_bytes([None, None]) + b"N" + tuple_bytes(["\x00toast", "t"]),
    ],
)
def test_what_the_compiled_decoder_refuses_gets_the_python_error(payload: bytes) -> None:
    cat = KeyCatalog()
    relation = relation_bytes(9, ["id", "b"], [INT8, BOOL], [True, False])
    begin = b"B" + struct.pack("!QqI", 1000, 0, 7)
    fast, slow = both_paths([begin, relation, payload], cat)
    assert fast[-1] == slow[-1]
    assert isinstance(fast[-1], tuple) and fast[-1][0] == "error", fast[-1]
