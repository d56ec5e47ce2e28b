"""Which shape changes of a captured table change rows that no WAL row change will bring in.

`ADD COLUMN ... DEFAULT` gives every existing row the value without a row change (a constant
default is stored once in pg_attribute, `atthasmissing`; a volatile one rewrites the table, which
logical decoding does not send). DROP COLUMN, RENAME COLUMN and ALTER COLUMN TYPE leave silver's
existing records with values the source rows no longer have, and so does a column that became
excluded or masked (silver would keep its plain values until each row changes, and carry an
unchanged TOASTed one forward into the new state). Each is answered with a re-snapshot
of the table (DESIGN §7.1 and §7.7), requested when the stream meets the new shape (a Relation
message) or, for a change no row change followed, when a run starts and finds the catalog's shape
other than the last one recorded.

Every change of a captured shape is also reported (`report_shape_change`): a metric, a log line and
a `schema_changed` alert (ingest/ops/watch.py), by kind: columns added, dropped, renamed, retyped,
and the key changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime

from psycopg import sql

from ingest.events import ColumnShape, RelationShape
from ingest.masking import MASKED_JSON_KIND, check_masks_followed
from ingest.ops.health import Alert
from ingest.ops.watch import SHAPE_CHANGES, shape_change_alert
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.pgoutput import RELATION_COLUMN_KEY_FLAG, Relation, RelationColumn
from ingest.sources.postgres.published import SENT_COLUMN, publishes_generated


def resnapshot_reason(admin: PostgresAdmin, before: RelationShape, after: RelationShape) -> str | None:
    """Why existing rows of the table differ from what silver holds after `before` -> `after`, or None.

    A new column counts only if it has a default or a stored missing value now (a column added
    without one is NULL in every existing row, which is what silver's records say by its absence).
    A column the catalog no longer has (dropped again since) is not asked about. A renamed masked
    column is masked under its new name already (the rules follow it by attnum: followed.py); a
    rename that still left a masked column's values under a name no rule masks (what could not be
    followed) raises SourceError (masking.check_masks_followed: by attnum when both shapes carry
    them) before the shape or anything in it is written.
    """
    with admin.conn.cursor() as cur:
        cur.execute(
            "select exists (select from pg_attribute where attrelid = %s and attisdropped)", (after.relation_id,)
        )
        row = cur.fetchone()
    check_masks_followed(
        f"{after.table_schema}.{after.table_name}",
        [(c.name, c.json_kind == MASKED_JSON_KIND, c.attnum) for c in before.columns],
        [(c.name, c.json_kind == MASKED_JSON_KIND, c.attnum) for c in after.columns],
        bool(row and row[0]),
        admin.src.name,
    )
    reasons = []
    excluded, masked = _newly_ruled(admin, before, after)
    if excluded or masked:
        reasons.append(
            f"column {', '.join(excluded + masked)} became {'excluded' if excluded else 'masked'}"
            f"{' or masked' if excluded and masked else ''}: the snapshot rewrites every record with the rule applied; "
            "bronze and silver history from before holds the values as they were (docs/masking.md: purging it)"
        )
    prior = _prior_columns(before, after)
    # A name whose values are no longer its column's: dropped, renamed away, or taken by another column.
    dropped = [c.name for c in before.columns if prior.get(c.name) is not c and c.name not in excluded]
    if dropped:
        reasons.append(f"column {', '.join(dropped)} dropped or renamed")
    retyped = [c.name for c in after.columns if c.name in prior and _type(prior[c.name]) != _type(c)]
    if retyped:
        reasons.append(f"column {', '.join(retyped)} changed type")
    added = [c.name for c in after.columns if c.name not in prior]
    if added:
        with admin.conn.cursor() as cur:
            cur.execute(
                "select attname from pg_attribute where attrelid = %s and attname = any(%s) "
                "and not attisdropped and (atthasmissing or atthasdef) order by attnum",
                (after.relation_id, added),
            )
            defaulted = [str(r[0]) for r in cur.fetchall()]
        if defaulted:
            reasons.append(f"column {', '.join(defaulted)} added with a default (existing rows have its value)")
    return "; ".join(reasons) or None


ADDED = "added"
DROPPED = "dropped"
RENAMED = "renamed"
RETYPED = "retyped"
KEY_CHANGED = "key_changed"


def shape_change_kinds(
    before: RelationShape, after: RelationShape, excluded: Sequence[str] = ()
) -> dict[str, list[str]]:
    """What a user sees changed from `before` to `after` of one table: kind -> its columns (empty: nothing).

    Columns are matched as `_prior_columns` says (by attnum when both shapes have them, else by
    name and place): one matched under another name is renamed (`old -> new`), one of `after`
    unmatched added, one of `before` unmatched dropped. `excluded`: columns that left the shape
    because a rule began to exclude them (not a change of the source). `retyped`: the type or its
    modifier changed (through a rename too). `key_changed`: the key columns (through renames) or the
    replica identity changed. A column that became masked changes no kind.
    """
    prior = _prior_columns(before, after)
    renamed = {n: c.name for n, c in prior.items() if c.name != n}
    kept = {c.name for c in prior.values()}
    out: dict[str, list[str]] = {}
    added = [c.name for c in after.columns if c.name not in prior]
    dropped = [c.name for c in before.columns if c.name not in kept and c.name not in excluded]
    retyped = [c.name for c in after.columns if c.name in prior and _type(prior[c.name]) != _type(c)]
    key_then = [renamed.get(n, n) for n in _key(after)]
    if key_then != _key(before) or before.replica_identity != after.replica_identity:
        out[KEY_CHANGED] = [f"({', '.join(_key(before))}) -> ({', '.join(_key(after))})"]
    for kind, cols in (
        (ADDED, added),
        (DROPPED, dropped),
        (RENAMED, [f"{b} -> {a}" for a, b in renamed.items()]),
        (RETYPED, retyped),
    ):
        if cols:
            out[kind] = cols
    return dict(sorted(out.items()))


def recorded_shape_change_alerts(
    history: Sequence[tuple[RelationShape, datetime]],
    excluded: Callable[[str], Sequence[str]],
    since: datetime,
) -> list[Alert]:
    """The `schema_changed` alerts of one source as bronze recorded its shapes: `status --json`'s view.

    `history`: every recorded shape of the source's tables with when it was written, in position order
    (BronzeState.shape_history). A table whose latest change (a shape with kinds, against the one
    recorded before it) was written at or after `since` holds one alert with the message the
    running capture's alert has; a shape recorded again unchanged is no change. Read from bronze,
    so `status --json` in another process than the run, or with ingest stopped, shows them too.
    `excluded`: the columns a config rule excludes from a table (`schema.table`): one that left
    the shape is not a change of the source.
    """
    before: dict[tuple[str, str], RelationShape] = {}
    held: dict[str, Alert] = {}
    for shape, written in history:
        key = (shape.table_schema, shape.table_name)
        previous, before[key] = before.get(key), shape
        if previous is None or written < since:
            continue
        table = f"{shape.table_schema}.{shape.table_name}"
        kinds = shape_change_kinds(previous, shape, excluded(table))
        if kinds:
            held[table] = shape_change_alert(table, kinds)
    return [held[t] for t in sorted(held)]


def _prior_columns(before: RelationShape, after: RelationShape) -> dict[str, ColumnShape]:
    """Each column of `after` that `before` had already (maybe under another name): its name -> that column.

    By attnum when every column of both shapes has one: `drop a; rename b to a; add b` is then a
    dropped, b renamed to a, b added, where the names alone say nothing changed. Else (a shape
    recorded before attnums were) by name, and a name gone with a new one at the same place, when
    both shapes have as many columns, is one column renamed (a renamed column keeps its place).
    """
    if all(c.attnum is not None for c in (*before.columns, *after.columns)):
        by_attnum = {c.attnum: c for c in before.columns}
        return {c.name: by_attnum[c.attnum] for c in after.columns if c.attnum in by_attnum}
    old = {c.name: c for c in before.columns}
    new = {c.name for c in after.columns}
    prior = {c.name: old[c.name] for c in after.columns if c.name in old}
    if len(before.columns) == len(after.columns):
        for b, a in zip(before.columns, after.columns, strict=True):
            if b.name != a.name and b.name not in new and a.name not in old:
                prior[a.name] = b
    return prior


def _type(c: ColumnShape) -> tuple[int, int]:
    return (c.type_oid, c.type_modifier)


def with_attnums(admin: PostgresAdmin, shape: RelationShape) -> RelationShape:
    """`shape` with each column's pg_attribute.attnum, when the catalog still has exactly those columns.

    And with each composite column's fields (`with_fields`), whatever the attnums.

    A shape is met in a Relation message, which carries no attnums, maybe well after the catalog
    changed again: the numbers are taken only when every column of the shape is in the catalog
    under its name and type, in the same order (pgoutput sends columns by attnum). Else the shape
    is returned as it is and compared by names (`_prior_columns`).
    """
    shape = with_fields(admin, shape)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select attname, attnum, atttypid::bigint, atttypmod from pg_attribute "
            "where attrelid = %s and attnum > 0 and not attisdropped",
            (shape.relation_id,),
        )
        catalog = {str(r[0]): (int(str(r[1])), int(str(r[2])), int(str(r[3]))) for r in cur.fetchall()}
    numbers: list[int] = []
    for c in shape.columns:
        got = catalog.get(c.name)
        if got is None or got[1:] != _type(c) or (numbers and got[0] <= numbers[-1]):
            return shape
        numbers.append(got[0])
    return replace(shape, columns=tuple(replace(c, attnum=n) for c, n in zip(shape.columns, numbers, strict=True)))


# Types below this oid are built in (Postgres' FirstNormalObjectId): none is a composite a column holds.
FIRST_NORMAL_OID = 16384


def with_fields(admin: PostgresAdmin, shape: RelationShape) -> RelationShape:
    """`shape` with the fields of each column whose type is a composite (or an array of one) now.

    The catalog's fields when the shape is met (PostgresAdmin.composite_fields), one level deep:
    gold types a composite column as a struct of them (docs/dbt.md, "Gold types"). A type changed
    since the change that sent the shape is not told apart (ALTER TYPE sends no Relation message);
    Postgres prints a composite's values with its current fields. Built-in types are not asked
    about: no query for a table without user-defined types.
    """
    oids = sorted(
        {c.type_oid for c in shape.columns if c.type_oid >= FIRST_NORMAL_OID and c.json_kind != MASKED_JSON_KIND}
    )
    if not oids:
        return shape
    fields = admin.composite_fields(oids)
    if not fields:
        return shape
    return replace(shape, columns=tuple(replace(c, fields=fields.get(c.type_oid)) for c in shape.columns))


def _key(shape: RelationShape) -> list[str]:
    return [c.name for c in sorted((c for c in shape.columns if c.pk_position is not None), key=_pk_position)]


def _pk_position(c: ColumnShape) -> int:
    return c.pk_position or 0


def report_shape_change(admin: PostgresAdmin, before: RelationShape, after: RelationShape) -> None:
    """Count, log and alert the change of a captured table's shape from `before` to `after` (ingest/ops/watch.py).

    Reported when the capture meets it (a Relation message, or the catalog at a shape check), before
    the new shape is durable: a run interrupted in between meets it, and reports it, again.
    """
    excluded, _masked = _newly_ruled(admin, before, after)
    SHAPE_CHANGES.record(
        admin.src.name, f"{after.table_schema}.{after.table_name}", shape_change_kinds(before, after, excluded)
    )


def _newly_ruled(admin: PostgresAdmin, before: RelationShape, after: RelationShape) -> tuple[list[str], list[str]]:
    """Columns a rule began to exclude, and columns it began to mask, between `before` and `after`.

    An excluded column is not in a shape: one `after` lacks that the table still has is excluded
    now (not dropped or renamed). A masked one has json_kind `masked`.
    """
    kinds = {c.name: c.json_kind for c in before.columns}
    masked = [
        c.name
        for c in after.columns
        if c.json_kind == MASKED_JSON_KIND and kinds.get(c.name, MASKED_JSON_KIND) != MASKED_JSON_KIND
    ]
    gone = [c.name for c in before.columns if c.name not in {a.name for a in after.columns}]
    if not gone:
        return [], masked
    with admin.conn.cursor() as cur:
        cur.execute(
            "select attname from pg_attribute where attrelid = %s and attname = any(%s) and attnum > 0 "
            "and not attisdropped order by attnum",
            (after.relation_id, gone),
        )
        return [str(r[0]) for r in cur.fetchall()], masked


def relation_now(admin: PostgresAdmin, table: str) -> Relation | None:
    """The Relation message the stream would get for `table` now (None if the table is gone).

    Columns as pgoutput sends them (not dropped, by attnum; published.SENT_COLUMN), flagged as its key
    flags are: the replica identity's index columns, every column under FULL. Fed to a
    ChangeBuilder it gives the shape a change of the table would record now, exclusions and masks
    applied as the stream applies them.
    """
    schema, name = table.split(".", 1)
    generated = publishes_generated(admin)
    with admin.conn.cursor() as cur:
        cur.execute(
            "select c.oid::bigint, c.relreplident::text from pg_class c where c.oid = to_regclass(%s)",
            (sql.Identifier(schema, name).as_string(admin.conn),),
        )
        row = cur.fetchone()
        if row is None:
            return None
        relation_id, identity = int(str(row[0])), str(row[1])
        cur.execute(
            "select attname, atttypid::bigint, atttypmod from pg_attribute a where attrelid = %s and attnum > 0 "
            f"and not attisdropped and {SENT_COLUMN} order by attnum",
            (relation_id, generated),
        )
        cols = cur.fetchall()
    key = set(admin.record_key(relation_id))
    return Relation(
        relation_id,
        schema,
        name,
        identity,
        tuple(
            RelationColumn(
                RELATION_COLUMN_KEY_FLAG if identity == "f" or str(c[0]) in key else 0,
                str(c[0]),
                int(str(c[1])),
                int(str(c[2])),
            )
            for c in cols
        ),
    )
