"""Turns decoded pgoutput messages into ChangeEvents: transaction framing, commit_index, JSON rows.

Pure: no I/O. What it needs from the database (primary keys, type names) it asks a `Catalog`
the adapter implements; the value mapping and the row encoder (`encode_record`, `encode_key`)
live in `values.py`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from ingest.errors import SourceError
from ingest.events import Action, ChangeEvent, ColumnShape, RelationShape
from ingest.masking import MASKED_JSON_KIND, TableMask
from ingest.sources.postgres import native
from ingest.sources.postgres.pgoutput import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgOutputMessage,
    Relation,
    Truncate,
    TypeInfo,
    Update,
    decode,
    pg_to_unix_us,
)
from ingest.sources.postgres.rows import encode_key, encode_record, json_keys, width_error

log = logging.getLogger(__name__)

_U32: Final = struct.Struct("!I")
# A transactional logical message with this prefix names a `schema.table` that no longer exists
# (admin.check_tables writes it): the builder turns it into a truncate of that table, since a DROP
# or RENAME writes no change of its own.
# Every slot of the database decodes every logical message, so the prefix written names the slot
# (table_gone_prefix) and a builder takes only its own slot's; the bare prefix (written before)
# is taken by every builder, as it was.
TABLE_GONE_PREFIX: Final = "changelake.tableGone"


def table_gone_prefix(slot: str) -> str:
    """The tombstone message prefix of the source that reads through `slot`."""
    return f"{TABLE_GONE_PREFIX}:{slot}"


# pg_class.relreplident, as a Relation message carries it
REPLICA_IDENTITY_DEFAULT: Final = "d"
REPLICA_IDENTITY_INDEX: Final = "i"
REPLICA_IDENTITY_FULL: Final = "f"
# Message type bytes the compiled decoder takes (pgoutput Insert, Update, Delete), and its actions.
_ROW_MESSAGES: Final = frozenset(b"IUD")
_NATIVE_ACTIONS: Final = (Action.INSERT, Action.UPDATE, Action.DELETE)


class Catalog(Protocol):
    """What the change builder asks of the source's catalog (implemented with I/O elsewhere)."""

    def record_key(self, relation_id: int) -> list[str]:
        """The columns that identify a record, in key order; empty if none.

        The replica identity's index: the primary key, or the index of REPLICA IDENTITY USING
        INDEX. REPLICA IDENTITY FULL without a primary key keys by every column.
        """

    def encoder(self, type_oid: int) -> Callable[[bytes], str]:
        """A function from a pgoutput text value to its JSON fragment."""

    def json_kind(self, type_oid: int) -> str:
        """The name of the JSON mapping used for the type."""

    def type_name(self, type_oid: int, type_modifier: int) -> str:
        """format_type() of the type with the column's modifier (a domain's base type: what gold types by)."""


@runtime_checkable
class MaskingCatalog(Protocol):
    """A catalog that also says which tables are captured and which of their columns must never land."""

    def captures(self, relation_id: int, schema: str, table: str) -> bool:
        """Whether the table's changes are written: one the source is configured to capture."""

    def table_mask(self, schema: str, table: str, sent: Sequence[str], key: Sequence[str]) -> TableMask | None:
        """The table's excluded and masked columns for changes carrying `sent`, None if it has none.

        SourceError if a rule names a column the table does not have.
        """


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """A source transaction is complete: events up to it may be made durable and acknowledged."""

    commit_lsn: int
    end_lsn: int
    commit_ts_us: int


@dataclass(slots=True)
class _Rel:
    schema: str
    name: str
    table: str  # schema.name, for errors
    names: tuple[str, ...]
    keys_json: tuple[str, ...]  # '"col":' prefixes
    encoders: tuple[Callable[[bytes], str], ...]
    pk_idx: tuple[int, ...]
    shape: RelationShape
    native: Any = None  # the compiled decoder of this relation's rows (native.py), if it has one
    # Positions of the columns written when some are excluded (masking.py), and the relation's
    # width as sent; None: every column (no cost on the unmasked path).
    keep: tuple[int, ...] | None = None
    width: int = 0
    captured: bool = True  # False: a table the publication holds but the config does not list

    def project(self, values: Sequence[Any]) -> Sequence[Any]:
        """The row's written columns: all of them, or those `keep` lists (excluded ones dropped)."""
        if self.keep is None:
            return values
        if len(values) != self.width:
            raise width_error(self.table, len(values), self.width)
        return [values[i] for i in self.keep]


def historic_key(msg: Relation, catalog_key: list[str]) -> list[str]:
    """The record key that was true when `msg` was written: today's catalog key unless it disagrees.

    The catalog is read now, the Relation message as of its WAL position (review finding C1): a key
    column renamed since, a primary key moved to another (or a later) column, or the table dropped
    made the catalog's key wrong for old WAL, and decoding it failed on every restart. Under DEFAULT
    and USING INDEX the message's key flags are the identity's columns as they were then: they win
    whenever they name other columns (the catalog's order is kept when they agree: a composite key
    in index order, as snapshots page by it). Under FULL every column is flagged; a catalog key the
    message does not carry (FULL, or no identity at all back then) falls back to every column.
    """
    names = [c.name for c in msg.columns]
    if msg.replica_identity in (REPLICA_IDENTITY_DEFAULT, REPLICA_IDENTITY_INDEX):
        flagged = [c.name for c in msg.columns if c.is_key]
        if flagged and set(flagged) != set(catalog_key):
            if catalog_key:
                log.warning(
                    "table %s.%s: the catalog's key %s is not the one this WAL was written with (%s): the key "
                    "changed since; these changes are keyed by %s (a snapshot of the table re-keys its records)",
                    msg.namespace,
                    msg.name,
                    catalog_key,
                    flagged,
                    flagged,
                )
            return flagged
    if catalog_key and not set(catalog_key) <= set(names):
        # FULL, or no identity when this WAL was written (inserts only): a key added since.
        log.warning(
            "table %s.%s: the catalog's key %s is not in this WAL's columns (the key changed since): these "
            "changes are keyed by every column, as under REPLICA IDENTITY FULL without a primary key",
            msg.namespace,
            msg.name,
            catalog_key,
        )
        return names
    return catalog_key


class ChangeBuilder:
    """Consumes pgoutput messages in stream order and emits ChangeEvents and TxnEnds.

    Responsibilities: track the open transaction (commit LSN from Begin, xid, commit time), number
    every Insert/Update/Delete/Truncate/Message from 0 (DESIGN §2), keep the relation cache, encode
    rows and keys to JSON, and collect table shapes not seen before (for bronze.source_relations).
    Columns a table excludes are dropped and masked ones hashed (or nulled) before any JSON is
    built, in `record`, `old_record` and the shape alike; such relations take the Python path.
    """

    def __init__(self, catalog: Catalog, use_native: bool = True, slot: str | None = None) -> None:
        """Start outside any transaction with an empty relation cache.

        `use_native`: decode row changes with the compiled decoder where it applies (native.py).
        `slot`: the slot the stream reads; tombstone messages written for another slot stay messages.
        """
        self.catalog = catalog
        self.use_native = use_native
        self._gone_prefixes = {TABLE_GONE_PREFIX} | ({table_gone_prefix(slot)} if slot is not None else set())
        self._rules = catalog if isinstance(catalog, MaskingCatalog) else None
        # Row changes of tables the config does not list, by table: dropped, never written.
        self.uncaptured: dict[str, int] = {}
        self._rels: dict[int, _Rel] = {}
        self.in_txn = False
        self._commit_lsn = 0
        self._xid = 0
        self._ts = 0
        self._index = 0
        self.new_shapes: list[RelationShape] = []

    # -- relations -------------------------------------------------------------------------
    def _uncaptured(self, msg: Relation) -> None:
        """Remember a table the publication sends but the config does not list: its changes are dropped.

        Such a table has no rules (a masked table removed from the config would land in plain
        text), no snapshot and no re-snapshot, so what bronze could hold of it is neither safe nor
        complete: nothing of it is written, and the skip is counted and said once per Relation.
        """
        table = f"{msg.namespace}.{msg.name}"
        self.uncaptured.setdefault(table, 0)
        log.warning(
            "table %s is in the publication but not in the source's configured tables: its changes are not "
            "captured (skipped so far: %d). Remove it from the publication, or add it to `tables`",
            table,
            self.uncaptured[table],
        )
        self._rels[msg.relation_id] = _Rel(
            msg.namespace,
            msg.name,
            table,
            (),
            (),
            (),
            (),
            RelationShape(msg.relation_id, msg.namespace, msg.name, msg.replica_identity, (), self._commit_lsn),
            captured=False,
        )

    def _skip(self, rel: _Rel) -> None:
        self.uncaptured[rel.table] = self.uncaptured.get(rel.table, 0) + 1

    def _relation(self, msg: Relation) -> None:
        if self._rules is not None and not self._rules.captures(msg.relation_id, msg.namespace, msg.name):
            self._uncaptured(msg)
            return
        all_names = tuple(c.name for c in msg.columns)
        pk = historic_key(msg, self.catalog.record_key(msg.relation_id))
        if not pk:
            if msg.replica_identity != REPLICA_IDENTITY_FULL:
                raise SourceError(
                    f"table {msg.namespace}.{msg.name} has no primary key and no REPLICA IDENTITY FULL "
                    f"(replica identity {msg.replica_identity!r}), so its changes cannot be keyed; add a primary "
                    "key or set REPLICA IDENTITY FULL, or leave the table out of the publication"
                )
            pk = list(all_names)
        mask = self._rules.table_mask(msg.namespace, msg.name, all_names, pk) if self._rules is not None else None
        keep: tuple[int, ...] | None = None
        columns = msg.columns
        if mask is not None:
            bad = mask.touches(pk)
            if bad:
                raise SourceError(
                    f"table {msg.namespace}.{msg.name}: key column {', '.join(bad)} is excluded or masked in the "
                    "config; record_pk must carry the key as it is (docs/masking.md)"
                )
            if any(c.name in mask.exclude for c in columns):
                keep = tuple(i for i, c in enumerate(columns) if c.name not in mask.exclude)
                columns = tuple(columns[i] for i in keep)
        names = tuple(c.name for c in columns)
        pk_idx = tuple(names.index(k) for k in pk)
        masked = mask.mask if mask is not None else frozenset()
        cols = tuple(
            ColumnShape(
                name=c.name,
                type_oid=c.type_oid,
                type_name=self.catalog.type_name(c.type_oid, c.type_modifier),
                type_modifier=c.type_modifier,
                is_key=c.is_key,
                pk_position=pk.index(c.name) + 1 if c.name in pk else None,
                json_kind=MASKED_JSON_KIND if c.name in masked else self.catalog.json_kind(c.type_oid),
            )
            for c in columns
        )
        shape = RelationShape(msg.relation_id, msg.namespace, msg.name, msg.replica_identity, cols, self._commit_lsn)
        # Every Relation message, even one whose names and types are those of the cached relation:
        # `drop a; rename b to a; add b` looks the same by name, and only the capture (with the
        # catalog's attnums, schema_changes.with_attnums) tells it apart. The server sends one after
        # a change of the table and at a stream's start, so this costs a lookup per table per run.
        self.new_shapes.append(shape)
        keys_json = json_keys(names)
        encoders = tuple(self.catalog.encoder(c.type_oid) for c in columns)
        if mask is not None and masked:
            hashed = mask.encoder()
            encoders = tuple(hashed if n in masked else e for n, e in zip(names, encoders, strict=True))
        # The compiled decoder knows no exclusions or masks: a relation with any stays in Python.
        compiled = self.use_native and mask is None
        self._rels[msg.relation_id] = _Rel(
            msg.namespace,
            msg.name,
            f"{msg.namespace}.{msg.name}",
            names,
            keys_json,
            encoders,
            pk_idx,
            shape,
            native.row_encoder(encoders, keys_json, names, pk_idx, f"{msg.namespace}.{msg.name}") if compiled else None,
            keep,
            len(all_names),
        )

    def _rel(self, relation_id: int) -> _Rel:
        rel = self._rels.get(relation_id)
        if rel is None:
            raise SourceError(f"pgoutput sent a change for relation {relation_id} before its Relation message")
        return rel

    # -- events ----------------------------------------------------------------------------
    def _row_event(
        self,
        action: Action,
        rel: _Rel,
        relation_id: int,
        record_pk: str,
        old_record_pk: str | None,
        record: str | None,
        old_record: str | None,
        unchanged_toast: tuple[str, ...] | None,
    ) -> ChangeEvent:
        """The next event of the transaction for an Insert/Update/Delete (built positionally: hot path)."""
        ev = ChangeEvent(
            self._commit_lsn,
            self._index,
            self._xid,
            self._ts,
            action,
            rel.schema,
            rel.name,
            relation_id,
            record_pk,
            old_record_pk,
            record,
            old_record,
            unchanged_toast,
        )
        self._index += 1
        return ev

    def _event(self, action: Action, **kw: object) -> ChangeEvent:
        ev = ChangeEvent(self._commit_lsn, self._index, self._xid, self._ts, action, **kw)  # type: ignore[arg-type]
        self._index += 1
        return ev

    def feed_payload(self, payload: bytes) -> ChangeEvent | TxnEnd | None:
        """Take the next pgoutput message as its bytes: `feed(decode(payload))`, faster for row changes.

        An Insert/Update/Delete of a relation with a compiled decoder is decoded by it; anything
        else, and any message it refuses, by `decode` and `feed`.
        """
        if payload[0] in _ROW_MESSAGES:
            (relation_id,) = _U32.unpack_from(payload, 1)
            rel = self._rels.get(relation_id)
            if rel is not None and not rel.captured:
                self._skip(rel)  # not decoded at all: nothing of it is written
                return None
            if rel is not None and rel.native is not None:
                try:
                    # Unguarded (one Python frame less per row); a panic is a refusal here (native_guard.py).
                    code, record, pk, old_record, old_pk, toast = rel.native.unguarded_change(payload)
                except ValueError:
                    pass  # the Python decoder takes it, and raises the error a user should see
                except BaseException as e:
                    if not isinstance(rel.native.refusal(e), ValueError):
                        raise  # not a panic (KeyboardInterrupt, MemoryError ...): as it was
                    # a panic: warned once for the relation, and the Python decoder takes the message
                else:
                    ev = ChangeEvent(
                        self._commit_lsn,
                        self._index,
                        self._xid,
                        self._ts,
                        _NATIVE_ACTIONS[code],
                        rel.schema,
                        rel.name,
                        relation_id,
                        pk,
                        old_pk,
                        record,
                        old_record,
                        tuple(toast) if toast else None,
                    )
                    self._index += 1
                    return ev
        return self.feed(decode(payload))

    def feed(self, msg: PgOutputMessage) -> ChangeEvent | TxnEnd | None:
        """Take the next message; return the event or transaction end it produces, if any."""
        match msg:
            case Insert():
                rel = self._rel(msg.relation_id)
                if not rel.captured:
                    self._skip(rel)
                    return None
                new = rel.project(msg.new)
                record, toast = encode_record(rel.table, rel.keys_json, rel.encoders, rel.names, new)
                pk = encode_key(rel.table, rel.keys_json, rel.encoders, rel.pk_idx, new)
                return self._row_event(Action.INSERT, rel, msg.relation_id, pk, None, record, None, toast)
            case Update():
                rel = self._rel(msg.relation_id)
                if not rel.captured:
                    self._skip(rel)
                    return None
                new = rel.project(msg.new)
                old = rel.project(msg.old) if msg.old is not None else None
                record, toast = encode_record(rel.table, rel.keys_json, rel.encoders, rel.names, new)
                # An unchanged-TOAST key column takes its value from the old tuple (encode_key); in
                # `record` it stays absent and listed in `unchanged_toast`, like any other column.
                pk = encode_key(rel.table, rel.keys_json, rel.encoders, rel.pk_idx, new, old)
                old_record = old_pk = None
                if old is not None:
                    old_record, _ = encode_record(rel.table, rel.keys_json, rel.encoders, rel.names, old)
                    old_pk = encode_key(rel.table, rel.keys_json, rel.encoders, rel.pk_idx, old)
                    if old_pk == pk:
                        old_pk = None
                return self._row_event(Action.UPDATE, rel, msg.relation_id, pk, old_pk, record, old_record, toast)
            case Delete():
                rel = self._rel(msg.relation_id)
                if not rel.captured:
                    self._skip(rel)
                    return None
                old = rel.project(msg.old)
                old_record, _ = encode_record(rel.table, rel.keys_json, rel.encoders, rel.names, old)
                pk = encode_key(rel.table, rel.keys_json, rel.encoders, rel.pk_idx, old)
                return self._row_event(Action.DELETE, rel, msg.relation_id, pk, None, None, old_record, None)
            case Begin():
                if self.in_txn:
                    raise SourceError("pgoutput sent Begin inside an open transaction")
                self.in_txn = True
                self._commit_lsn, self._xid, self._ts = msg.final_lsn, msg.xid, pg_to_unix_us(msg.commit_ts_us)
                self._index = 0
                return None
            case Commit():
                if not self.in_txn:
                    raise SourceError("pgoutput sent Commit outside a transaction")
                if msg.commit_lsn != self._commit_lsn:
                    raise SourceError(
                        f"Commit LSN {msg.commit_lsn} does not match the Begin's final LSN {self._commit_lsn}"
                    )
                self.in_txn = False
                return TxnEnd(msg.commit_lsn, msg.end_lsn, pg_to_unix_us(msg.commit_ts_us))
            case Relation():
                self._relation(msg)
                return None
            case Truncate():
                rels = [(r, self._rel(r)) for r in msg.relation_ids]
                for _, rel in rels:
                    if not rel.captured:
                        self._skip(rel)
                rels = [(r, rel) for r, rel in rels if rel.captured]
                if not rels:
                    return None
                return self._event(
                    Action.TRUNCATE,
                    table_schema=rels[0][1].schema,
                    table_name=rels[0][1].name,
                    relation_id=rels[0][0],
                    truncated_tables=tuple(rel.table for _, rel in rels),
                    truncate_options=msg.options,
                )
            case LogicalMessage():
                content = msg.content.decode("utf-8", errors="replace")
                if not msg.transactional:
                    # Outside any transaction: its own unit at its LSN (index 0), complete at once.
                    return ChangeEvent(
                        msg.lsn,
                        0,
                        0,
                        0,
                        Action.MESSAGE,
                        message_prefix=msg.prefix,
                        message_content=content,
                        message_transactional=False,
                    )
                if msg.prefix in self._gone_prefixes:
                    # A table that no longer exists (admin.check_tables): a truncate of its records,
                    # after every change of it in WAL order. One event, as the message would be.
                    schema, _, name = content.partition(".")
                    return self._event(
                        Action.TRUNCATE,
                        table_schema=schema,
                        table_name=name,
                        truncated_tables=(content,),
                        message_prefix=msg.prefix,
                        message_content=content,
                        message_transactional=True,
                    )
                return self._event(
                    Action.MESSAGE, message_prefix=msg.prefix, message_content=content, message_transactional=True
                )
            case TypeInfo() | Origin():
                return None  # types are resolved through the catalog; origins are not part of bronze
        raise SourceError(f"no handling for pgoutput message {msg!r}")  # decode() only yields known types
