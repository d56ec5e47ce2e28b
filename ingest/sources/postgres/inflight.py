"""Decodes a streamed transaction's changes while it is still running, into rows that wait for its commit.

Pure apart from the catalog's reads and the rows' spill file. With protocol 2 the server sends a
large transaction in chunks while it runs; decoding them as they come overlaps ingest's decoding
with the server's sending, so that after the Stream Commit only the stamping of positions and the
Delta writes remain (protocol 1 overlaps the same way, the server having spilled the transaction
first). Decoding early must give the rows protocol 1 gives after the commit, so it uses only what
the commit cannot change: the Relation messages the transaction itself carries, built-in types,
tables the config names without rules. Anything else, and any failure, sends the transaction back
to the path that decodes its held messages at the commit (streamed.py), which then decides.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from ingest.bronze import pending
from ingest.bronze.pending import PendingRows
from ingest.events import Action
from ingest.masking import TableMask
from ingest.sources.postgres.changes import Catalog, ChangeBuilder, MaskingCatalog
from ingest.sources.postgres.pgoutput import Begin
from ingest.sources.postgres.values import Encoder

log = logging.getLogger(__name__)

# Type OIDs below this are PostgreSQL's built-in types (FirstNormalObjectId): none can be created,
# altered or dropped by the transaction being decoded, so the catalog's answer for them is final.
FIRST_NORMAL_OID: Final = 16384


class NotDecodableEarly(Exception):
    """What decoding before the commit would need may change with the commit itself."""


class EarlyCatalog:
    """The source's catalog as decoding before a commit may use it: only answers the commit cannot change.

    Responsibilities: answer for built-in types and for tables the config names without rules;
    refuse (NotDecodableEarly) a user-defined type (it may be created in the transaction), a table
    the config does not name (whether it is captured depends on whether it exists after the commit)
    and a table with rules (they are checked against its columns as of the commit).
    """

    def __init__(self, catalog: Catalog, configured: Callable[[str], bool]) -> None:
        """Wrap `catalog`; `configured("schema.table")` says whether the config names the table."""
        self.catalog = catalog
        self.configured = configured
        self._rules = catalog if isinstance(catalog, MaskingCatalog) else None

    @staticmethod
    def _builtin(type_oid: int) -> None:
        if type_oid >= FIRST_NORMAL_OID:
            raise NotDecodableEarly(f"type {type_oid} is not built in")

    def record_key(self, relation_id: int) -> list[str]:
        """The catalog's key (changes.historic_key prefers the Relation message's flags when they differ)."""
        return self.catalog.record_key(relation_id)

    def encoder(self, type_oid: int) -> Encoder:
        """The catalog's encoder of a built-in type."""
        self._builtin(type_oid)
        return self.catalog.encoder(type_oid)

    def json_kind(self, type_oid: int) -> str:
        """The catalog's JSON mapping of a built-in type."""
        self._builtin(type_oid)
        return self.catalog.json_kind(type_oid)

    def type_name(self, type_oid: int, type_modifier: int) -> str:
        """The catalog's name of a built-in type."""
        self._builtin(type_oid)
        return self.catalog.type_name(type_oid, type_modifier)

    def captures(self, relation_id: int, schema: str, table: str) -> bool:
        """True for a table the config names; NotDecodableEarly for any other."""
        if not self.configured(f"{schema}.{table}"):
            raise NotDecodableEarly(f"table {schema}.{table} is not one the config names")
        return True

    def table_mask(self, schema: str, table: str, sent: Sequence[str], key: Sequence[str]) -> TableMask | None:
        """None for a table without rules; NotDecodableEarly for one with rules."""
        if self._rules is not None and self._rules.table_mask(schema, table, sent, key) is not None:
            raise NotDecodableEarly(f"table {schema}.{table} has exclusion or masking rules")
        return None


class InflightTransaction:
    """One streamed transaction's changes decoded as they arrive, per (sub)transaction.

    Responsibilities: decode each change with a ChangeBuilder of its own (its own relation cache:
    the server sends every relation a streamed transaction uses within it), keep the events as
    PendingRows tagged with their subtransaction, drop an aborted subtransaction's, and give up on
    the first change it may not decode before the commit (`failed`): the caller then decodes the
    held messages at the commit instead.
    """

    def __init__(
        self,
        catalog: EarlyCatalog,
        xid: int,
        use_native: bool = True,
        slot: str | None = None,
        spill_bytes: int | None = None,
    ) -> None:
        """Start the transaction `xid`; `spill_bytes`: decoded rows held in memory before they go to a file.

        None: pending.SPILL_BYTES.
        """
        self.xid = xid
        self.builder = ChangeBuilder(catalog, use_native=use_native, slot=slot)
        self.builder.feed(Begin(0, 0, xid))  # its events carry position (0, n) until the commit stamps them
        self.rows: PendingRows | None = PendingRows(pending.SPILL_BYTES if spill_bytes is None else spill_bytes)

    @property
    def failed(self) -> bool:
        """Whether the transaction must be decoded at its commit instead."""
        return self.rows is None

    def feed(self, subxid: int, payload: bytes) -> None:
        """Decode the next change (a protocol 1 message) of subtransaction `subxid`."""
        rows = self.rows
        if rows is None:
            return
        try:
            out = self.builder.feed_payload(payload)
            if out is None:
                self.builder.new_shapes.clear()  # shapes are recorded at the commit, by the stream's builder
                return
            if not isinstance(out, tuple) or (out.action is Action.MESSAGE and not out.message_transactional):
                raise NotDecodableEarly(f"{out!r} inside a streamed transaction")
        except Exception as e:  # noqa: BLE001 - any failure: the commit decodes the held messages and decides
            # Not swallowed: the same messages are decoded at the commit, where an error that
            # protocol 1 would raise is raised (and one of a transaction that aborts never is).
            log.info("streamed transaction %d is decoded at its commit instead of as it arrives: %s", self.xid, e)
            self.close()
            return
        rows.add(subxid, out)

    def abort(self, subxid: int) -> None:
        """Drop subtransaction `subxid`'s rows."""
        if self.rows is not None:
            self.rows.abort(subxid)

    def close(self) -> None:
        """Forget the rows (their spill file is deleted)."""
        if self.rows is not None:
            self.rows.close()
            self.rows = None


def inflight_decoders(
    catalog: Catalog, configured: Callable[[str], bool], slot: str | None = None
) -> Callable[[int], InflightTransaction]:
    """A factory of InflightTransactions over `catalog`; `configured("schema.table")` as EarlyCatalog takes it."""
    early = EarlyCatalog(catalog, configured)
    return lambda xid: InflightTransaction(early, xid, slot=slot)
