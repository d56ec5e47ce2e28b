"""Postgres catalog work over a normal connection: checks, publication, slot, keys, health."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import psycopg
from psycopg import sql

from ingest.bronze.state import BronzeState
from ingest.capture.retry import is_transient
from ingest.config import PostgresSource
from ingest.errors import SlotInvalidatedError, SourceError, SourceUnavailableError
from ingest.events import lsn_to_int
from ingest.sources.postgres.changes import table_gone_prefix
from ingest.sources.postgres.followed import RecordedColumn, bronze_recorded_columns, follow_renames
from ingest.sources.postgres.left_scope import tombstone_left_scope
from ingest.sources.postgres.membership import memberships
from ingest.sources.postgres.published import (
    supports_column_lists,
    supports_generated_columns,
    sync_column_lists,
    table_columns,
    table_spec,
    wanted_column_list,
)
from ingest.sources.postgres.replication import (
    OWN_STATEMENT_DEADLINE_S,
    abort_after,
    application_name,
    safe_dsn,
    session_conninfo,
)
from ingest.sources.postgres.scope import adopt_scope, publication_members, publish_after_writers
from ingest.sources.postgres.standby import (
    WAL_POSITION_SQL,
    check_standby,
    ensure_still_standby,
    primary_dsn,
    server_role,
    standby_snapshots_logged,
)

log = logging.getLogger(__name__)

HEARTBEAT_PREFIX = "changelake.heartbeat"
FAILOVER_SLOTS_VERSION = 170000  # server_version_num of the first release with failover slots
MIN_SERVER_VERSION = 140000  # the first release whose pgoutput sends logical messages
DRAIN_PREFIX = "changelake.drain"
# How long a start waits for the writers of a table it adds to the publication (scope.py).
START_LOCK_TIMEOUT = "10s"


@dataclass(frozen=True, slots=True)
class SlotHealth:
    """What `status` shows of a slot: its confirmed position, lag and WAL retention state."""

    slot: str
    confirmed_flush_lsn: int | None
    current_wal_lsn: int
    wal_status: str | None
    active_pid: int | None

    @property
    def lag_bytes(self) -> int | None:
        """WAL the slot still holds back: current WAL position minus the confirmed flush LSN."""
        if self.confirmed_flush_lsn is None:
            return None
        return max(0, self.current_wal_lsn - self.confirmed_flush_lsn)


def connect(src: PostgresSource, primary: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection for ingest's own short statements; SourceError if it fails.

    Deterministic value output, local commits and bounded statements (`session_conninfo`). With
    `primary`, to the source's `primary_dsn` (a standby source's writes; SourceError naming the
    option when it is not set).
    """
    dsn = primary_dsn(src) if primary else src.dsn
    try:
        return psycopg.connect(session_conninfo(dsn, application_name(src.name), own_statements=True), autocommit=True)
    except psycopg.OperationalError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "connection failed"
        error = SourceUnavailableError if is_transient(e) else SourceError
        what = "primary_dsn " if primary else ""
        raise error(f"source {src.name!r}: cannot connect to {what}{safe_dsn(dsn)}: {first}") from None


class PostgresAdmin:
    """Owns the non-replication connection of one Postgres source.

    Responsibilities: check the server is set up for logical decoding, create the publication
    and slot when missing (idempotently), look up primary keys, emit heartbeats and drain
    markers, and report slot health.
    On a standby source the slot is the standby's, and what must be written (messages, the
    publication) goes to its primary (`writer`).
    """

    def __init__(self, src: PostgresSource) -> None:
        """Connect to `src` (SourceError with the DSN minus its password if that fails)."""
        self.src = src
        self.conn = connect(src)
        self._standby: bool | None = None
        self._primary: psycopg.Connection[tuple[object, ...]] | None = None
        # `schema.table` -> its publication rows before ingest replaced them itself (membership.py)
        self.memberships_before_own: dict[str, frozenset[str]] = {}
        # The columns bronze recorded (prepare_source reads them): mask rules follow them through renames.
        self.recorded_columns: set[RecordedColumn] = set()

    def close(self) -> None:
        """Close the connection (and the one to the primary of a standby source)."""
        self.conn.close()
        if self._primary is not None:
            self._primary.close()

    @property
    def standby(self) -> bool:
        """Whether the source's server is a standby (in recovery): its writes then go to `primary_dsn`."""
        if self._standby is None:
            self._standby = server_role(self.conn).in_recovery
        return self._standby

    def await_standby(self) -> None:
        """On a standby source, wait until the standby has replayed what its primary has flushed.

        After ingest changed the publication on the primary: the standby's catalog then has the
        change. SourceUnavailableError after OWN_STATEMENT_DEADLINE_S (a standby lagging that far).
        """
        if not self.standby:
            return
        row = self.writer().execute("select pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + OWN_STATEMENT_DEADLINE_S
        while self._one("select pg_last_wal_replay_lsn() >= %s::pg_lsn", (str(row[0]),)) != (True,):
            if time.monotonic() > deadline:
                raise SourceUnavailableError(
                    f"source {self.src.name!r}: the standby did not replay its primary's WAL as far as {row[0]} in "
                    f"{OWN_STATEMENT_DEADLINE_S:g} s (ingest changed the publication there); trying again"
                )
            time.sleep(0.05)

    def writer(self) -> psycopg.Connection[tuple[object, ...]]:
        """The connection ingest's logical messages are written through: the primary's for a standby.

        StandbyPromotedError (transient: the capture restarts on the promoted server) once the
        standby has left recovery: nothing more goes to the old primary.
        """
        if not self.standby:
            return self.conn
        ensure_still_standby(self.conn, self.src)
        if self._primary is None:
            self._primary = connect(self.src, primary=True)
        return self._primary

    def _one(self, query: str | sql.Composed, params: tuple[object, ...] = ()) -> tuple[object, ...] | None:
        with self.conn.cursor() as cur:
            cur.execute(query, params)
            return cur.fetchone()

    def check_server(self) -> None:
        """The server must be 14 or newer, wal_level logical; the role must be allowed to replicate.

        Heartbeats, snapshot watermarks and the `--once` drain marker are logical messages, which
        pgoutput sends from 14 (its `messages` option): on 13 the stream could not start.
        """
        row = self._one(
            "select current_setting('wal_level'), r.rolreplication or r.rolsuper, "
            "current_setting('server_version_num')::int, current_setting('server_version') "
            "from pg_roles r where r.rolname = current_user"
        )
        assert row is not None
        wal_level, can_replicate, version_num, version = row
        if int(str(version_num)) < MIN_SERVER_VERSION:
            raise SourceError(
                f"source {self.src.name!r}: PostgreSQL {version} is not supported: ingest needs 14 or newer, "
                "whose pgoutput sends the logical messages it places heartbeats, snapshots and the --once drain "
                "marker with (docs/postgres.md, Versions)"
            )
        if wal_level != "logical":
            raise SourceError(
                f"source {self.src.name!r}: wal_level is {wal_level!r}; logical decoding needs "
                "wal_level = logical in postgresql.conf and a server restart"
            )
        if not can_replicate:
            raise SourceError(
                f"source {self.src.name!r}: role lacks the REPLICATION attribute; "
                "run ALTER ROLE <user> REPLICATION as a superuser"
            )
        if self.standby:
            check_standby(self.src, server_role(self.conn), server_role(self.writer()))
        elif self.src.primary_dsn is not None:
            log.warning(
                "source=%s primary_dsn is set but %s is a primary (promoted?): everything is written there and "
                "primary_dsn is unused; remove it",
                self.src.name,
                safe_dsn(self.src.dsn),
            )

    def _check_identity(self, qualified: str, replident: str, has_pk: bool, pk_deferrable: bool = False) -> None:
        """A table's replica identity must key its changes, before the publication is touched.

        NOTHING is refused even with a primary key: a published table without a replica identity
        makes the source application's own UPDATE and DELETE fail (review finding C4). So is
        DEFAULT over a DEFERRABLE primary key, which Postgres does not take as a replica identity
        (relcache skips indexes that are not immediate): it is NOTHING in effect. FULL without a
        primary key keys by every column (its snapshot pages by CTID).
        """
        name = self.src.name
        if replident == "d" and has_pk and pk_deferrable:
            raise SourceError(
                f"source {name!r}: table {qualified} has a DEFERRABLE primary key and REPLICA IDENTITY DEFAULT; "
                "Postgres uses no deferrable index as a replica identity, so once published the application's "
                f"UPDATE and DELETE on it would fail. Run ALTER TABLE {qualified} REPLICA IDENTITY FULL (records "
                "stay keyed by the primary key, and key shifts inside a transaction are folded right), or "
                "REPLICA IDENTITY USING INDEX <a unique index that is not deferrable>"
            )
        if replident == "n":
            raise SourceError(
                f"source {name!r}: table {qualified} has REPLICA IDENTITY NOTHING: once published, the "
                "application's UPDATE and DELETE on it would fail. Run ALTER TABLE ... REPLICA IDENTITY DEFAULT "
                "(with a primary key), USING INDEX <unique index> or FULL first"
            )
        if not has_pk and replident == "d":
            raise SourceError(
                f"source {name!r}: table {qualified} has no primary key and no REPLICA IDENTITY FULL, so its "
                f"updates and deletes cannot be keyed; add a primary key or run "
                f"ALTER TABLE {qualified} REPLICA IDENTITY FULL"
            )

    def check_published_tables(self) -> None:
        """Tables the publication sends beyond the configured ones must be keyable too (review C2).

        A user's own publication (or FOR ALL TABLES) can hold tables ingest was not told about;
        one without a usable replica identity would stop the stream at its first change, on every
        start. Checked up front, with the way out.
        """
        with self.conn.cursor() as cur:
            cur.execute(
                "select t.schemaname || '.' || t.tablename, c.relreplident::text, "
                "exists(select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary) "
                "from pg_publication_tables t join pg_namespace n on n.nspname = t.schemaname "
                "join pg_class c on c.relnamespace = n.oid and c.relname = t.tablename where t.pubname = %s",
                (self.src.publication_name,),
            )
            rows = cur.fetchall()
        for qualified, replident, has_pk in rows:
            if str(qualified) in self.src.tables:
                continue
            if str(replident) == "n" or (str(replident) == "d" and not has_pk):
                raise SourceError(
                    f"source {self.src.name!r}: publication {self.src.publication_name!r} also publishes "
                    f"{qualified}, which has no usable replica identity (no primary key, identity "
                    f"{str(replident)!r}): its first change would stop the stream. Remove it from the publication "
                    f"(ALTER PUBLICATION ... DROP TABLE {qualified}), or give it a primary key or REPLICA "
                    "IDENTITY FULL"
                )

    def check_tables(self) -> None:
        """Every configured table exists and can be keyed (a primary key or REPLICA IDENTITY FULL).

        A table's key columns (the primary key; every column under REPLICA IDENTITY FULL without
        one) can be neither excluded nor masked (ConfigError, before anything is changed), and a
        rule naming a column the table does not have is refused (SourceError: it would mask nothing),
        unless it names a masked column renamed since bronze recorded it: that rule follows the
        column to its new name, with a warning (followed.py; `recorded_columns`, read by prepare_source).
        """
        named = set(self.src.selection.named)
        for qualified in self.src.tables:
            try:
                self.check_table(qualified)
            except SourceError as e:
                if qualified in named:
                    raise
                raise SourceError(f"{e} (selected by a pattern: list it under `exclude` to leave it out)") from None

    def check_table(self, qualified: str) -> None:
        """One table of check_tables: it exists, can be keyed, and its column rules fit it."""
        schema, table = qualified.split(".")
        row = self._one(
            "select c.relreplident, exists(select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary), "
            "exists(select 1 from pg_index i where i.indrelid = c.oid and i.indisprimary and not i.indimmediate) "
            "from pg_class c join pg_namespace n on n.oid = c.relnamespace "
            "where n.nspname = %s and c.relname = %s and c.relkind in ('r', 'p')",
            (schema, table),
        )
        if row is None:
            self.tombstone_gone(qualified)
            raise SourceError(
                f"source {self.src.name!r}: configured table {qualified} does not exist (dropped or renamed?). "
                "If it was captured, the stream tombstones its records in silver once it reaches this point "
                "of the WAL. Remove it from `tables`, or list it under its new name (snapshotted then)."
            )
        replident, has_pk, pk_deferrable = row
        self._check_identity(qualified, str(replident), bool(has_pk), bool(pk_deferrable))
        mask = follow_renames(self, qualified, self.src.masks().table(qualified), self.recorded_columns)
        if mask is not None:
            mask.check_names(qualified, table_columns(self, qualified).columns, self.src.name)
            ident = sql.Identifier(schema, table).as_string(self.conn)
            oid = self._one("select %s::regclass::oid::bigint", (ident,))
            assert oid is not None
            key = self.record_key(int(str(oid[0])))
            if not key:
                key = [str(r[0]) for r in self._all_columns(schema, table)]
            mask.check_key(qualified, key, self.src.name)

    def tombstone_gone(self, qualified: str) -> None:
        """Have the stream truncate `qualified`'s records at this point of the WAL (review W12).

        A DROP or RENAME TABLE writes no change the stream could turn into deletes, and silver kept
        the records live under the old name. A message now follows every change of the table in
        WAL order, so its truncate ends them all; the stream writes it whatever the configured
        tables are then. Only when the slot exists (else nothing would decode it, and nothing of
        the table was captured through it); one per refused start, which is harmless: a truncate
        leaves deleted records as they were.
        """
        if self._one("select 1 from pg_replication_slots where slot_name = %s", (self.src.slot_name,)) is not None:
            self.emit_message(table_gone_prefix(self.src.slot_name), qualified)

    def _all_columns(self, schema: str, table: str) -> list[tuple[object, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(
                "select a.attname from pg_attribute a join pg_class c on c.oid = a.attrelid "
                "join pg_namespace n on n.oid = c.relnamespace "
                "where n.nspname = %s and c.relname = %s and a.attnum > 0 and not a.attisdropped",
                (schema, table),
            )
            return cur.fetchall()

    def ensure_publication(self) -> None:
        """Create the publication for the configured tables, or add tables missing from it.

        With `create_publication` a table it names that left the config is dropped from it
        (`drop_unconfigured`).

        Partitioned tables are captured as their root (DESIGN §7.7): the publication publishes
        through the partition root, so a change in any partition arrives under the root's name
        and key, and a partition attached later is captured too. Membership is read from the
        publication's own table list (`pg_publication_rel`, which names a partitioned table
        itself) plus `pg_publication_tables` (schema-wide and all-tables publications): the latter
        alone lists a root's partitions instead of the root unless it publishes via the root, and
        every start then tried to add the root again (DuplicateObject).

        A table with excluded columns is published with a column list without them (Postgres 15+,
        published.py); an existing publication's lists are checked and, if ingest manages it, set.
        """
        name = self.src.publication_name
        row = self._one("select pubviaroot from pg_publication where pubname = %s", (name,))
        if row is not None:
            self._check_publication_options()
        masks = self.src.masks()
        lists = supports_column_lists(self)
        specs = {
            t: table_spec(t, wanted_column_list(self, t, masks.table(t)) if lists else None) for t in self.src.tables
        }
        tables = list(specs.values())
        if row is None:
            if not self.src.create_publication:
                raise SourceError(
                    f"source {self.src.name!r}: publication {name!r} does not exist and create_publication "
                    "is false; create it with CREATE PUBLICATION ... FOR TABLE ... "
                    "WITH (publish_via_partition_root = true)"
                )
            # From 18 stored generated columns are published too, so they reach bronze from the
            # stream and from snapshots alike (published.SENT_COLUMN follows the publication).
            options = "publish_via_partition_root = true"
            if supports_generated_columns(self):
                options += ", publish_generated_columns = stored"
            try:
                self.writer().execute(
                    sql.SQL("create publication {} for table {} with ({})").format(
                        sql.Identifier(name), sql.SQL(", ").join(tables), sql.SQL(options)
                    )
                )
            except psycopg.errors.InsufficientPrivilege as e:
                raise SourceError(f"source {self.src.name!r}: cannot create publication {name!r}: {e}") from None
            self.await_standby()
            return
        (via_root,) = row
        have = publication_members(self)
        self.drop_unconfigured()
        missing = [t for t in self.src.tables if t not in have]
        if missing and self.src.create_publication:
            try:
                publish_after_writers(self, {t: specs[t] for t in missing}, START_LOCK_TIMEOUT)
            except psycopg.errors.LockNotAvailable:
                raise SourceUnavailableError(
                    f"source {self.src.name!r}: a transaction writing to {', '.join(missing)} stayed open for "
                    f"{START_LOCK_TIMEOUT}: the table is published once its writers have ended (so none of their "
                    "rows is missed); trying again"
                ) from None
        elif missing:
            raise SourceError(
                f"source {self.src.name!r}: publication {name!r} lacks tables {', '.join(missing)}; run ALTER "
                f"PUBLICATION {name} ADD TABLE {', '.join(missing)}. A table captured before was not sent while "
                "it was out of the publication: the next start re-snapshots it once it is back"
            )
        partitioned = self.partitioned_tables()
        if partitioned and not via_root:
            if not self.src.create_publication:
                raise SourceError(
                    f"source {self.src.name!r}: {', '.join(partitioned)} is partitioned, and publication {name!r} "
                    "publishes its partitions under their own names; run ALTER PUBLICATION "
                    f"{name} SET (publish_via_partition_root = true) so its changes arrive as the table's"
                )
            self.writer().execute(
                sql.SQL("alter publication {} set (publish_via_partition_root = true)").format(sql.Identifier(name))
            )
        if lists:
            # Setting a column list replaces the table's row (one transaction: no change goes
            # unsent); the rows before are what the recorded membership is compared with.
            self.memberships_before_own = memberships(self, self.src.tables)
        sync_column_lists(self)
        self.await_standby()

    def drop_unconfigured(self) -> None:
        """With `create_publication`, drop from the publication the tables it names that left the config.

        A table removed from `tables` (and so from its column rules) that stayed published would go
        on being sent, unmasked; the stream drops changes of tables the config does not list anyway
        (changes.py), and this stops the server sending them. Tables a schema-wide or all-tables
        publication covers cannot be dropped one by one and are left to that skip.
        """
        if not self.src.create_publication:
            return
        name = self.src.publication_name
        with self.conn.cursor() as cur:
            cur.execute(
                "select n.nspname, c.relname from pg_publication p join pg_publication_rel r on r.prpubid = p.oid "
                "join pg_class c on c.oid = r.prrelid join pg_namespace n on n.oid = c.relnamespace "
                "where p.pubname = %s order by 1, 2",
                (name,),
            )
            extra = [(str(n), str(t)) for n, t in cur.fetchall() if f"{n}.{t}" not in self.src.tables]
        if not extra:
            return
        log.warning(
            "source=%s: dropping %s from publication %s: not in the configured tables any more",
            self.src.name,
            ", ".join(f"{n}.{t}" for n, t in extra),
            name,
        )
        self.writer().execute(
            sql.SQL("alter publication {} drop table {}").format(
                sql.Identifier(name), sql.SQL(", ").join(sql.Identifier(n, t) for n, t in extra)
            )
        )
        self.await_standby()

    def _check_publication_options(self) -> None:
        """An existing publication must send every change of the configured tables (review W11).

        Publish actions: without insert, update, delete or truncate those changes never reach
        bronze, and snapshots cannot make up for them. Ingest sets them when it manages the
        publication (`create_publication`), else refuses. Row filters (Postgres 15+): a snapshot reads
        every row, and an update that moves a row out of the filter arrives as a delete, so silver
        would hold neither the source nor the filter: refused, before anything is changed.
        (Column lists: published.py; `publish_via_partition_root`: ensure_publication.)
        """
        name = self.src.publication_name
        row = self._one(
            "select pubinsert, pubupdate, pubdelete, pubtruncate from pg_publication where pubname = %s", (name,)
        )
        assert row is not None
        off = [a for a, on in zip(("insert", "update", "delete", "truncate"), row, strict=True) if not on]
        if supports_column_lists(self):  # row filters came with column lists, in 15
            with self.conn.cursor() as cur:
                cur.execute(
                    "select n.nspname || '.' || c.relname, pg_get_expr(r.prqual, r.prrelid) from pg_publication p "
                    "join pg_publication_rel r on r.prpubid = p.oid join pg_class c on c.oid = r.prrelid "
                    "join pg_namespace n on n.oid = c.relnamespace where p.pubname = %s and r.prqual is not null",
                    (name,),
                )
                filtered = [(str(t), str(q)) for t, q in cur.fetchall() if str(t) in self.src.tables]
            if filtered:
                table, where = filtered[0]
                raise SourceError(
                    f"source {self.src.name!r}: publication {name!r} publishes {table} with a row filter "
                    f"(WHERE {where}); snapshots read every row and a row updated out of the filter arrives as a "
                    "delete, so silver could match neither the table nor the filter. Publish the table without one "
                    f"(ALTER PUBLICATION {name} SET TABLE ...), or capture a view of it elsewhere"
                )
        if not off:
            return
        if not self.src.create_publication:
            raise SourceError(
                f"source {self.src.name!r}: publication {name!r} does not publish {', '.join(off)}, so those changes "
                f"would never reach bronze; run ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, "
                "truncate')"
            )
        log.warning("publication %s did not publish %s: setting every action", name, ", ".join(off))
        self.writer().execute(
            sql.SQL("alter publication {} set (publish = 'insert, update, delete, truncate')").format(
                sql.Identifier(name)
            )
        )

    def partitioned_tables(self) -> list[str]:
        """The configured tables that are partitioned (captured as their root)."""
        out = []
        for qualified in self.src.tables:
            schema, table = qualified.split(".")
            row = self._one(
                "select 1 from pg_class c join pg_namespace n on n.oid = c.relnamespace "
                "where n.nspname = %s and c.relname = %s and c.relkind = 'p'",
                (schema, table),
            )
            if row is not None:
                out.append(qualified)
        return out

    def _create_slot(self, slot: str) -> None:
        """Create the pgoutput slot; from PostgreSQL 17 as a failover slot.

        A failover slot is synchronized to standbys that set `sync_replication_slots` (and list
        it in `synchronized_standby_slots`), so it survives a promotion; before 17 a logical slot
        exists on the primary only, and a failover loses it (docs/postgres.md: the next start
        reports slot loss with the re-snapshot recovery).
        """
        row = self._one("select current_setting('server_version_num')::int")
        # Creating a slot waits for every transaction running now to end: not one of the session's short statements.
        self._one("select set_config('statement_timeout', '0', false)")
        if self.standby:
            # A slot on a standby cannot be a failover slot (the server refuses it), and waits for a
            # running-transactions record from the primary.
            with standby_snapshots_logged(self.src.name, self.writer()):
                self._one("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        elif row is not None and int(str(row[0])) >= FAILOVER_SLOTS_VERSION:
            # (slot_name, plugin, temporary, twophase, failover)
            self._one("select pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)", (slot,))
        else:
            self._one("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        self.conn.execute("reset statement_timeout")

    def ensure_slot(self) -> bool:
        """Create the pgoutput slot if missing; True if it was created. Invalidated slot: loud error."""
        slot = self.src.slot_name
        row = self._one("select plugin, wal_status from pg_replication_slots where slot_name = %s", (slot,))
        if row is None:
            self._create_slot(slot)
            self.warn_unsynchronized_failover()
            return True
        self.warn_unsynchronized_failover()
        plugin, wal_status = row
        if plugin != "pgoutput":
            raise SourceError(f"source {self.src.name!r}: slot {slot!r} uses plugin {plugin!r}, not pgoutput")
        if wal_status == "lost" and self.src.on_history_lost == "resnapshot":
            # The slot can never stream again; a new one starts now, and the capture sees the gap
            # between bronze and the new slot and recovers it (whole-table re-snapshots).
            log.warning("source=%s slot %s is invalidated: dropping and recreating it", self.src.name, slot)
            self._one("select pg_drop_replication_slot(%s)", (slot,))
            self._create_slot(slot)
            return True
        if wal_status == "lost":
            raise SlotInvalidatedError(
                f"source {self.src.name!r}: replication slot {slot!r} is invalidated (wal_status = lost): the "
                "server removed WAL it still needed, so changes were lost. Recover: "
                "set `on_history_lost: resnapshot` on the source and run changelake-ingest again: it recreates the "
                "slot and snapshots every table afresh (silver tombstones the rows deleted during the gap). Raise "
                "max_slot_wal_keep_size so this does not recur."
            )
        return False

    def warn_unsynchronized_failover(self) -> None:
        """Warn when the slot is a failover slot on a primary with `synchronized_standby_slots` empty.

        Then the primary sends ingest changes no standby has received yet: after a failover the
        promoted standby's synchronized slot can be behind what bronze holds, and its history
        differs from bronze's for the changes it never got (docs/postgres.md, Failover).
        """
        # Before 17 pg_replication_slots has no `failover` column: the query would not even plan.
        if self.standby or self.conn.info.server_version < FAILOVER_SLOTS_VERSION:
            return
        row = self._one(
            "select s.failover, current_setting('synchronized_standby_slots', true) from pg_replication_slots s "
            "where s.slot_name = %s",
            (self.src.slot_name,),
        )
        if row is not None and row[0] is True and not str(row[1] or "").strip():
            log.warning(
                "source=%s slot %s is a failover slot but synchronized_standby_slots is empty on the primary: "
                "ingest may receive changes a standby has not, and after a failover the promoted standby would "
                "not have them; list the standbys' physical slots in synchronized_standby_slots",
                self.src.name,
                self.src.slot_name,
            )

    def record_key(self, relation_id: int) -> list[str]:
        """The columns that identify a record of `relation_id`, in key order (empty if none).

        The replica identity's index: under REPLICA IDENTITY USING INDEX that index (its columns are
        what a delete's old key carries: keying by the primary key instead gave deletes a null key,
        review finding W2), else the primary key. Empty for a table without either (REPLICA
        IDENTITY FULL then keys by every column) and for a relation that no longer exists.
        """
        with self.conn.cursor() as cur:
            cur.execute(
                "select a.attname from pg_class c join pg_index i on i.indrelid = c.oid "
                "cross join lateral unnest(i.indkey) with ordinality k(attnum, ord) "
                "join pg_attribute a on a.attrelid = i.indrelid and a.attnum = k.attnum "
                "where c.oid = %s and case when c.relreplident = 'i' then i.indisreplident else i.indisprimary end "
                "order by k.ord",
                (relation_id,),
            )
            return [str(r[0]) for r in cur.fetchall()]

    def type_names(self, types: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
        """format_type() of each (type oid, type modifier), a domain's of its base type (bronze.source_relations).

        The modifier is the column's (pg_attribute.atttypmod, a Relation message's typmod), so
        numeric(12,2) stays numeric(12,2) (review W8). A domain is named by the type under it, with the
        domain's own modifier (Postgres' getBaseTypeAndTypmod): gold types the values, which are the
        base type's. A type the server does not know is left out.
        """
        with self.conn.cursor() as cur:
            cur.execute(
                "with recursive base(oid, typmod, type_oid, type_mod) as ("
                " select k.oid, k.typmod, k.oid, k.typmod from unnest(%s::oid[], %s::int[]) k(oid, typmod)"
                " union all"
                " select base.oid, base.typmod, t.typbasetype, t.typtypmod from base"
                " join pg_type t on t.oid = base.type_oid where t.typtype = 'd')"
                " select base.oid::bigint, base.typmod, format_type(base.type_oid, nullif(base.type_mod, -1))"
                " from base join pg_type t on t.oid = base.type_oid where t.typtype <> 'd'",
                ([t[0] for t in types], [t[1] for t in types]),
            )
            return {(int(str(r[0])), int(str(r[1]))): str(r[2]) for r in cur.fetchall()}

    def composite_fields(self, type_oids: list[int]) -> dict[int, tuple[tuple[str, str], ...]]:
        """Each composite type's fields, (name, type name as type_names gives it), in order (bronze.source_relations).

        Keyed by the oid asked for: a composite, an array of one, a domain over either (and an array
        of such a domain) are answered with the composite's fields; other types and a composite
        without fields are left out. A field's type is named as a column's is (type_names: with
        its modifier, a domain by its base type); a field that is itself a composite, or an array,
        is named and no deeper (gold keeps its Postgres text).
        """
        with self.conn.cursor() as cur:
            cur.execute(
                "with recursive base(oid, type_oid) as ("
                " select k.oid, k.oid from unnest(%s::oid[]) k(oid)"
                " union all"
                " select base.oid, case when t.typtype = 'd' then t.typbasetype else t.typelem end from base"
                " join pg_type t on t.oid = base.type_oid"
                " where t.typtype = 'd' or (t.typcategory = 'A' and t.typelem <> 0))"
                " select base.oid::bigint, a.attname::text, a.atttypid::bigint, a.atttypmod from base"
                " join pg_type t on t.oid = base.type_oid and t.typtype = 'c'"
                " join pg_attribute a on a.attrelid = t.typrelid and a.attnum > 0 and not a.attisdropped"
                " order by base.oid, a.attnum",
                (type_oids,),
            )
            rows = [(int(str(r[0])), str(r[1]), int(str(r[2])), int(str(r[3]))) for r in cur.fetchall()]
        names = self.type_names(sorted({(r[2], r[3]) for r in rows})) if rows else {}
        out: dict[int, list[tuple[str, str]]] = {}
        for oid, name, field_oid, field_mod in rows:
            out.setdefault(oid, []).append((name, names.get((field_oid, field_mod), str(field_oid))))
        return {oid: tuple(fields) for oid, fields in out.items()}

    def type_catalog_rows(self, query: str) -> list[tuple[object, ...]]:
        """Rows of `query` (the value mapper's pg_type query)."""
        with self.conn.cursor() as cur:
            cur.execute(query)
            return cur.fetchall()

    def emit_message(self, prefix: str, content: str) -> int:
        """Commit a transactional logical message; returns its LSN. Used as heartbeat and drain marker.

        Bounded (OWN_STATEMENT_DEADLINE_S): a server that does not answer is SourceUnavailableError
        and leaves this connection unusable, so that the stream's loop is never held by it.
        """
        what = f"source {self.src.name!r}: {prefix} message"
        conn = self.writer()  # on a standby source the primary's: its WAL replicates to the slot's server
        with abort_after(conn.pgconn.socket, OWN_STATEMENT_DEADLINE_S, what):
            row = conn.execute("select pg_logical_emit_message(true, %s, %s)::text", (prefix, content)).fetchone()
        assert row is not None
        return lsn_to_int(str(row[0]))

    def slot_health(self) -> SlotHealth:
        """Confirmed position, current WAL position, wal_status and active PID of the slot."""
        slot = self.src.slot_name
        row = self._one(
            f"select s.confirmed_flush_lsn::text, ({WAL_POSITION_SQL})::text, s.wal_status, s.active_pid "
            "from (select 1) one left join pg_replication_slots s on s.slot_name = %s",
            (slot,),
        )
        assert row is not None
        flush, cur, wal_status, pid = row
        return SlotHealth(
            slot,
            lsn_to_int(str(flush)) if flush else None,
            lsn_to_int(str(cur)),
            str(wal_status) if wal_status else None,
            int(str(pid)) if pid is not None else None,
        )


def prepare_source(src: PostgresSource, bronze: BronzeState | None = None) -> PostgresAdmin:
    """Check the source and create what is missing (publication, slot); returns the admin connection.

    With `bronze` (a run's start), a captured table that left scope while ingest was stopped is
    tombstoned if it is gone (dropped, renamed or moved out), before it leaves the publication; one
    left out by the config alone keeps its records (left_scope.py).
    """
    admin = PostgresAdmin(src)
    try:
        admin.check_server()
        adopt_scope(admin)
        if bronze is not None:
            tombstone_left_scope(admin, bronze)
            admin.recorded_columns = bronze_recorded_columns(bronze, src.name)
        admin.check_tables()
        admin.ensure_publication()  # on a standby source, on its primary (PostgresAdmin.writer)
        admin.check_published_tables()
        if admin.ensure_slot():
            log.info("created slot source=%s slot=%s", src.name, src.slot_name)
    except BaseException:
        admin.close()
        raise
    return admin
