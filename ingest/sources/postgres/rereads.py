"""The keys silver asks ingest to re-read (DESIGN §6): read from dbt's consumer_records, by path.

This is the one place where ingest reads what dbt built: the loop bronze -> silver -> ingest ->
bronze that DESIGN §6 requires for an update whose unchanged TOAST value had no image. Its
contract with the dbt side: the model `consumer_records` (under `<warehouse>/dbt/silver.db/`
unless `snapshot.reread_from` says otherwise) and its columns `source`, `table_schema`,
`table_name`, `record_pk`, `commit_lsn`, `commit_index`, `needs_reread` and `deleted`.
"""

from __future__ import annotations

import json
import logging

from ingest.bronze.writer import BronzeWriter
from ingest.config import PostgresSource
from ingest.errors import BronzeWriteError
from ingest.positions import KeyValues

log = logging.getLogger(__name__)


def key_values(record_pk: str) -> KeyValues:
    """A `record_pk`'s column values as text, in key order; a JSON null (a NULL column) is None.

    Numbers keep their text as written (a float or a long numeric is not rounded through a
    Python float); a nested value (an array) is its compact JSON. The one reading of a key both
    a re-read's request and its check of the rows read use, so they agree byte for byte.
    """
    texts = json.loads(record_pk, parse_float=str, parse_int=str).values()
    return tuple(
        text if text is None or isinstance(text, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)
        for text, v in zip(texts, json.loads(record_pk).values(), strict=True)
    )


class RereadKeys:
    """Owns what one source has asked to re-read in this process (each record state once)."""

    def __init__(self, src: PostgresSource, writer: BronzeWriter) -> None:
        """Read `src`'s keys from the silver table next to `writer`'s bronze."""
        self.src = src
        self.writer = writer
        self.path = src.snapshot.reread_from or f"{writer.warehouse}/dbt/silver.db/consumer_records"
        self._seen: set[tuple[object, ...]] = set()
        self._said_missing = False

    def keys_to_reread(self) -> dict[str, list[KeyValues]]:
        """New keys (as key text, in key order) per configured table; none if dbt has not built silver yet."""
        if not self.writer.tables.exists(self.path):
            if self.src.snapshot.reread_from:
                raise BronzeWriteError(
                    f"snapshot.reread_from of source {self.src.name!r} names {self.path}, which is not a Delta "
                    "table: no key silver marks needs_reread could be re-read (point it at consumer_records)"
                )
            if not self._said_missing:  # said once per run (-v), not silently (review finding W10)
                log.info(
                    "source=%s: no silver consumer_records at %s (dbt has not built it yet, or silver lives "
                    "elsewhere: set snapshot.reread_from), so keys silver marks needs_reread are not re-read",
                    self.src.name,
                    self.path,
                )
                self._said_missing = True
            return {}
        # delta-rs's query engine applies consumer_records' deletion vectors; its pyarrow dataset
        # reader refuses such a table (DeltaProtocolError) rather than return deleted rows. A table
        # it cannot read (a dbt-side schema change, a Delta feature delta-rs lacks, storage
        # failing) skips this round of re-reads with a warning: the keys stay marked in silver and
        # a later round takes them, while the capture of bronze, which does not depend on silver,
        # goes on. Re-reading the wrong keys is never an option; re-reading them later is.
        try:
            rows = self.writer.tables.query(
                "select table_schema, table_name, record_pk, commit_lsn, commit_index from t "
                f"where source = '{self.src.name}' and needs_reread and not deleted",
                t=self.path,
            ).to_pylist()
        except Exception as e:
            log.warning(
                "source=%s: cannot read needs_reread keys from %s, re-reads skipped this round: %s",
                self.src.name,
                self.path,
                e,
            )
            return {}
        by_table: dict[str, list[KeyValues]] = {}
        for r in rows:
            seen = (r["table_schema"], r["table_name"], r["record_pk"], r["commit_lsn"], r["commit_index"])
            table = f"{r['table_schema']}.{r['table_name']}"
            if seen in self._seen or table not in self.src.tables:
                continue
            self._seen.add(seen)
            by_table.setdefault(table, []).append(key_values(r["record_pk"]))
        return by_table
