"""What ingest asks of a Postgres catalog about one table: keys, types and encoders, shape, size."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from ingest.errors import SourceError
from ingest.events import RelationShape
from ingest.masking import TableMask
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.followed import follow_renames, recorded_columns
from ingest.sources.postgres.published import SENT_COLUMN, check_published, publishes_generated, table_columns
from ingest.sources.postgres.values import TYPE_CATALOG_SQL, Encoder, TypeCatalog, non_utf8_tolerant


class PgCatalog:
    """The ChangeBuilder's view of the source catalog: keys, type names, value encoders, column rules."""

    def __init__(self, admin: PostgresAdmin, known: Mapping[tuple[str, str], RelationShape] | None = None) -> None:
        """Load pg_type once; reloaded when a type created later shows up.

        `known` is the last recorded shape of each table bronze holds (kept up to date by the
        stream): what `captures` asks of a relation the catalog no longer has.
        """
        self.admin = admin
        self.masks = admin.src.masks()
        self.types = TypeCatalog.from_rows(admin.type_catalog_rows(TYPE_CATALOG_SQL))
        self._seen: set[int] = set()
        self._names: dict[tuple[int, int], str] = {}
        self._bronze_shapes = known if known is not None else {}

    def record_key(self, relation_id: int) -> list[str]:
        """The relation's record key, in key order (admin.record_key)."""
        return self.admin.record_key(relation_id)

    def captures(self, relation_id: int, schema: str, table: str) -> bool:
        """Whether changes of `schema.table` are written: the configured tables (the publication may hold more).

        A relation with no pg_class row is one of two things: a table dropped since (its old WAL),
        or one created by a transaction the walsender decoded before its commit became visible to
        other sessions (now and then, within milliseconds of the commit). On the publication
        ingest manages, every table it sends was selected when the change was made (a table that
        left the config was in scope then, and a table dropped before its removal from `tables`
        ends in the tombstone check_tables leaves), so its changes are written. A user's
        publication may send tables the selection leaves out (`FOR TABLES IN SCHEMA`, `FOR ALL
        TABLES`): there they are written only when the selection takes the name (a selected table
        dropped since, or one just created in scope, whose first page the fold places after them)
        or when bronze captured that very relation before. So an excluded table created and filled
        in one transaction, or created and dropped while ingest was stopped, stays out of bronze.
        With rules anywhere none is written: nothing says whether the dropped table had rules.
        """
        if f"{schema}.{table}" in self.admin.src.tables:  # read each time: tables come into scope while running
            return True
        if self.masks:
            return False
        with self.admin.conn.cursor() as cur:
            cur.execute("select 1 from pg_class where oid = %s", (relation_id,))
            if cur.fetchone() is not None:
                return False
        if self.admin.src.create_publication or self.admin.src.selection.matches((schema, table)):
            return True
        return any(shape.relation_id == relation_id for shape in self._bronze_shapes.values())

    def table_mask(self, schema: str, table: str, sent: Sequence[str], key: Sequence[str]) -> TableMask | None:
        """The excluded and masked columns of `schema.table` for changes carrying columns `sent` (None: none).

        Asked on each Relation message of a table with rules. A masked column renamed since it was
        recorded (in bronze's shape history, or the latest shape this run recorded) is masked
        under its new name too, with a warning (followed.py: by attnum). Every other column a rule
        names must exist in the table now (SourceError before anything of the table is written), and
        a column the changes carry that the table no longer has is masked (TableMask.for_relation).
        For a table with excluded columns it also checks that the publication's column list still
        sends every other column (published.check_published).
        """
        qualified = f"{schema}.{table}"
        mask = self.masks.table(qualified)
        if mask is None:
            return None
        latest = self._bronze_shapes.get((schema, table))
        if latest is not None:
            # Kept for the run (a later shape records the column under its new name); a new set, as
            # another thread's decoder may be reading the current one.
            self.admin.recorded_columns = self.admin.recorded_columns | recorded_columns([latest])
        mask = follow_renames(self.admin, qualified, mask, self.admin.recorded_columns)
        assert mask is not None
        mask = mask.for_relation(
            qualified, sent, table_columns(self.admin, qualified).columns, self.admin.src.name, key
        )
        check_published(self.admin, qualified, mask)
        return mask

    def _known(self, type_oid: int) -> None:
        if type_oid not in self._seen:
            self.types = TypeCatalog.from_rows(self.admin.type_catalog_rows(TYPE_CATALOG_SQL))
            self._seen.add(type_oid)

    def encoder(self, type_oid: int) -> Encoder:
        """Encoder of the type's text output to JSON."""
        self._known(type_oid)
        return non_utf8_tolerant(self.types.column_encoder(type_oid), self.admin.src.non_utf8)

    def json_kind(self, type_oid: int) -> str:
        """The JSON mapping name of the type."""
        self._known(type_oid)
        return self.types.json_kind(type_oid)

    def type_name(self, type_oid: int, type_modifier: int = -1) -> str:
        """format_type() of the type with the column's modifier; of the base type for a domain (W8)."""
        key = (type_oid, type_modifier)
        if key not in self._names:
            self._names.update(self.admin.type_names([key]))
        return self._names.get(key, str(type_oid))


@dataclass(frozen=True, slots=True)
class TableShape:
    """What a page read needs of a table: its columns (pgoutput's order) and primary key.

    `keyless`: the table has no key (REPLICA IDENTITY FULL): every column is its record key, as
    the stream keys its changes, and a snapshot pages it by CTID ranges.
    """

    schema: str
    name: str
    columns: tuple[str, ...]
    type_oids: tuple[int, ...]
    key_positions: tuple[int, ...]
    key_types: tuple[str, ...]  # format_type() with modifier, for the keyset cursor's casts
    partitioned: bool = False  # a partitioned table: read with its partitions (captured as its root)
    keyless: bool = False

    @property
    def scan(self) -> sql.Composable:
        """What a page reads: the table alone, or a partitioned table with every partition.

        `only` for a plain table: inheritance children publish their own changes. A partitioned
        table's partitions publish theirs as the root's (publish_via_partition_root).
        """
        ident = sql.Identifier(self.schema, self.name)
        return ident if self.partitioned else sql.SQL("only {}").format(ident)


def table_shape(admin: PostgresAdmin, table: str, keyless: bool = False) -> TableShape:
    """Columns as pgoutput sends them (not dropped, by attnum; published.SENT_COLUMN) and the primary key.

    A table without a key is a SourceError, unless `keyless`: then every column is the key.
    """
    schema, name = table.split(".", 1)
    generated = publishes_generated(admin)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select a.attname, a.atttypid::bigint, format_type(a.atttypid, a.atttypmod) "
            "from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace "
            "where n.nspname = %s and c.relname = %s and a.attnum > 0 and not a.attisdropped "
            f"and {SENT_COLUMN} order by a.attnum",
            (schema, name, generated),
        )
        cols = cur.fetchall()
        cur.execute(
            "select c.oid::bigint, c.relkind::text from pg_class c where c.oid = %s::regclass",
            (sql.Identifier(schema, name).as_string(admin.conn),),
        )
        row = cur.fetchone()
    if not cols or row is None:
        raise SourceError(f"source {admin.src.name!r}: table {table} does not exist")
    pk = admin.record_key(int(str(row[0])))
    names = tuple(str(c[0]) for c in cols)
    if not pk and keyless:
        oids = tuple(int(str(c[1])) for c in cols)
        types = tuple(str(c[2]) for c in cols)
        return TableShape(schema, name, names, oids, tuple(range(len(names))), types, str(row[1]) == "p", True)
    if not pk:
        raise SourceError(
            f"source {admin.src.name!r}: table {table} has no primary key; a snapshot pages by primary key "
            "(add one, or leave the table out of the snapshot)"
        )
    pos = tuple(names.index(k) for k in pk)
    oids = tuple(int(str(c[1])) for c in cols)
    key_types = tuple(str(cols[i][2]) for i in pos)
    return TableShape(schema, name, names, oids, pos, key_types, partitioned=str(row[1]) == "p")


def captured_shape(shape: TableShape, mask: TableMask | None, source: str) -> TableShape:
    """`shape` without the columns the config excludes: a page never selects them (masking.py).

    Raises SourceError if a rule names a column the table does not have (a typo, or a column
    renamed since: its values would be read as they are), ConfigError if a key column is excluded
    or masked (record_pk and the keyset cursor carry the key as it is).
    """
    if mask is None:
        return shape
    table = f"{shape.schema}.{shape.name}"
    mask.check_names(table, shape.columns, source)
    mask.check_key(table, [shape.columns[i] for i in shape.key_positions], source)
    keep = [i for i, c in enumerate(shape.columns) if c not in mask.exclude]
    names = tuple(shape.columns[i] for i in keep)
    return TableShape(
        shape.schema,
        shape.name,
        names,
        tuple(shape.type_oids[i] for i in keep),
        tuple(names.index(shape.columns[i]) for i in shape.key_positions),
        tuple(shape.key_types[i] for i in keep) if shape.keyless else shape.key_types,
        shape.partitioned,
        shape.keyless,
    )


def estimate_rows(admin: PostgresAdmin, table: str) -> int | None:
    """The planner's row estimate of `table` (pg_class.reltuples), None if never analyzed."""
    with admin.conn.cursor() as cur:
        # regclass parses its input as SQL: a mixed-case or special name must be quoted (review C3)
        ident = sql.Identifier(*table.split(".", 1)).as_string(admin.conn)
        cur.execute("select reltuples::bigint from pg_class where oid = %s::regclass", (ident,))
        row = cur.fetchone()
    n = int(str(row[0])) if row is not None and row[0] is not None else -1
    return n if n >= 0 else None
