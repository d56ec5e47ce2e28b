"""A Postgres source's candidate tables, read in one read-only transaction: nothing is created or changed.

The verdicts are the ones a start reaches (admin.check_server, admin.check_table, scope.resolve_scope,
snapshot.cannot_snapshot), run on the same connection inside `SET TRANSACTION READ ONLY` and rolled
back at the end, so discover cannot create a slot or publication nor write anything to the WAL.
"""

from __future__ import annotations

import psycopg

from ingest.config import PostgresSource
from ingest.discover import Candidate, Listing
from ingest.errors import IngestError
from ingest.sources.postgres.admin import PostgresAdmin
from ingest.sources.postgres.scope import Scope, publication_members, resolve_scope
from ingest.sources.postgres.snapshot import cannot_snapshot

IDENTITY_NAMES = {"d": "default", "f": "full", "i": "index", "n": "nothing"}
# Every user table with its identity, estimates and partitioning. A partitioned table has no storage
# of its own: its rows and size are its partitions'. reltuples is -1 until the table is analyzed.
TABLES_SQL = """
select n.nspname, c.relname, c.oid::bigint, c.relkind::text, c.relreplident::text,
  case when c.relkind = 'p' then
    (select sum(p.reltuples)::bigint from pg_partition_tree(c.oid) t join pg_class p on p.oid = t.relid
     where t.isleaf and p.reltuples >= 0)
  when c.reltuples >= 0 then c.reltuples::bigint end,
  case when c.relkind = 'p' then
    (select sum(pg_total_relation_size(t.relid))::bigint from pg_partition_tree(c.oid) t)
  else pg_total_relation_size(c.oid) end,
  case when c.relispartition then
    (select rn.nspname || '.' || r.relname from pg_class r join pg_namespace rn on rn.oid = r.relnamespace
     where r.oid = pg_partition_root(c.oid)) end
from pg_class c join pg_namespace n on n.oid = c.relnamespace
where c.relkind in ('r', 'p') and n.nspname <> 'information_schema' and n.nspname not like 'pg\\_%'
order by 1, 2
"""


def discover_postgres(src: PostgresSource, every: bool) -> Listing:
    """The tables `src` selects (`every`: all user tables, each saying whether it is selected)."""
    admin = PostgresAdmin(src)
    try:
        with admin.conn.transaction():
            admin.conn.execute("set transaction isolation level repeatable read, read only")
            listing = _listing(admin, every)
            raise psycopg.Rollback()
    finally:
        admin.close()
    return listing


def _listing(admin: PostgresAdmin, every: bool) -> Listing:
    src = admin.src
    server = None
    try:
        admin.check_server()
    except IngestError as e:
        server = str(e)
    scope = resolve_scope(admin)
    src.set_tables(scope.tables)  # what a start adopts: cannot_snapshot asks it
    with admin.conn.cursor() as cur:
        cur.execute("select 1 from pg_publication where pubname = %s", (src.publication_name,))
        pub_exists = cur.fetchone() is not None
        cur.execute(TABLES_SQL)
        rows = cur.fetchall()
    members = publication_members(admin) if pub_exists else None
    found = {f"{r[0]}.{r[1]}" for r in rows}
    selected = set(scope.tables) | set(scope.unpublished)
    out = [_missing(t) for t in src.selection.named if t not in found]
    for r in rows:
        name = f"{r[0]}.{r[1]}"
        if name in selected or every:
            out.append(_candidate(admin, r, name, name in selected, members, scope))
    where = f"publication {src.publication_name} " + (
        "exists" if pub_exists else "does not exist yet (`setup` or `run` creates it)"
    )
    return Listing(src.name, src.kind, where, tuple(out), server)


def _missing(table: str) -> Candidate:
    return Candidate(
        table,
        selected=True,
        refused=f"configured table {table} does not exist (named in `tables`: a start stops on it)",
    )


def _candidate(
    admin: PostgresAdmin, row: tuple[object, ...], name: str, selected: bool, members: set[str] | None, scope: Scope
) -> Candidate:
    _schema, _table, oid, relkind, replident, rows, size, root = row
    key = tuple(admin.record_key(int(str(oid))))
    replident = str(replident)
    key_kind = (
        ("replica identity index" if replident == "i" else "primary key")
        if key
        else "every column"
        if replident == "f"
        else "none"
    )
    notes: list[str] = []
    refused = None
    if root is not None:
        notes.append(f"a partition: captured as its root {root}, not by itself")
    else:
        try:
            admin.check_table(name)
        except IngestError as e:
            refused = str(e)
        if refused is None and name in scope.tables:
            why = cannot_snapshot(admin, name)
            if why is not None and admin.src.snapshot.initial:
                notes.append(f"cannot be snapshotted ({why}): its rows reach silver only as they change")
    if name in scope.unpublished:
        notes.append(
            f"selected, but publication {admin.src.publication_name} does not publish it: not captured until it does"
        )
    elif name in scope.published_elsewhere:
        notes.append("published, but outside the selection: its changes are skipped")
    return Candidate(
        name,
        selected=selected,
        key=key,
        key_kind=key_kind,
        replica_identity=IDENTITY_NAMES.get(replident, replident),
        rows=None if rows is None else int(str(rows)),
        size_bytes=None if size is None else int(str(size)),
        partitioned=str(relkind) == "p",
        partition_of=None if root is None else str(root),
        published=None if members is None else name in members,
        refused=refused,
        notes=tuple(notes),
    )
