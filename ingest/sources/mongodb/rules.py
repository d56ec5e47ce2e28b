"""The column rules each MongoDB collection was last captured under, kept in bronze, and what a change of them asks.

A Postgres table's rules are part of the shape the stream records (a masked column has json_kind
`masked`), so a rule added later is met as a shape change and the table is re-snapshotted. A
MongoDB collection has no shape, so the rules are recorded on their own: a logical message in
bronze.wal_events (prefix `changelake.columnRules`, writer `column-rules`, content: collection ->
its excluded and masked fields), written at start whenever they differ from the last one. A field
that became excluded or masked since the last record re-snapshots its collection, so silver's
records lose the plain values of documents nobody touched. Silver reads only row changes, so
the message is invisible to it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ingest.bronze.schemas import WAL_EVENTS_TABLE
from ingest.bronze.state import sql_str
from ingest.bronze.writer import BronzeWriter
from ingest.events import Action, ChangeEvent, SourceKind
from ingest.masking import SourceMasks
from ingest.sources.mongodb.changes import INCREMENT_BITS

log = logging.getLogger(__name__)

RULES_PREFIX: Final = "changelake.columnRules"
RULES_WRITER_ID: Final = "column-rules"  # its own writer: never mistaken for a stream event on resume

Rules = dict[str, dict[str, list[str]]]  # collection -> {"exclude": [...], "mask": [...]}


@dataclass(frozen=True, slots=True)
class RecordedRules:
    """The last rules message of a source: the rules and its position."""

    rules: Rules
    commit_lsn: int
    commit_index: int


def rules_now(masks: SourceMasks, collections: Iterable[str]) -> Rules:
    """The rules of `collections` (those with any) as a message records them, names sorted."""
    out: Rules = {}
    for coll in sorted(set(collections)):
        mask = masks.table(coll)
        if mask is not None:
            out[coll] = {"exclude": sorted(mask.exclude), "mask": sorted(mask.mask)}
    return out


def newly_ruled(before: Rules, now: Rules) -> dict[str, list[str]]:
    """Collection -> the fields it excludes or masks now and neither excluded nor masked at `before`.

    Un-ruling a field (its values land from now on) and moving one from masked to excluded (silver
    keeps a masked value, not a plain one) need no snapshot.
    """
    out: dict[str, list[str]] = {}
    for coll, rules in now.items():
        old = before.get(coll, {})
        covered = set(old.get("exclude", [])) | set(old.get("mask", []))
        fresh = sorted((set(rules["exclude"]) | set(rules["mask"])) - covered)
        if fresh:
            out[coll] = fresh
    return out


def recorded_rules(writer: BronzeWriter, source: str) -> RecordedRules | None:
    """The source's last rules message in bronze, None before the first (or before bronze exists)."""
    if not writer.exists(WAL_EVENTS_TABLE):
        return None
    rows = writer.tables.query(
        "select commit_lsn, commit_index, message_content from t "
        f"where source = {sql_str(source)} and writer_id = {sql_str(RULES_WRITER_ID)} "
        "order by commit_lsn desc, commit_index desc limit 1",
        t=writer.path(WAL_EVENTS_TABLE),
    ).to_pylist()
    if not rows:
        return None
    rules: Rules = json.loads(rows[0]["message_content"])
    return RecordedRules(rules, int(rows[0]["commit_lsn"]), int(rows[0]["commit_index"]))


def record_rules(writer: BronzeWriter, source: str, rules: Rules, at: int, last: RecordedRules | None) -> None:
    """Append a rules message at position `at` (after `last`, so that it is the latest and is not a retry)."""
    lsn, index = at, 0
    if last is not None and last.commit_lsn >= at:
        lsn, index = last.commit_lsn, last.commit_index + 1
    event = ChangeEvent(
        commit_lsn=lsn,
        commit_index=index,
        xid=0,
        # The position's own time, not now: the record must not make bronze look fresher (status's
        # last_commit_at) than the changes it holds.
        commit_ts_us=(lsn >> INCREMENT_BITS) * 1_000_000,
        action=Action.MESSAGE,
        message_prefix=RULES_PREFIX,
        message_content=json.dumps(rules, sort_keys=True, separators=(",", ":")),
        message_transactional=False,
    )
    writer.append_events(source, SourceKind.MONGODB, RULES_WRITER_ID, [event])
