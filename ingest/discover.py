"""`changelake-ingest discover`: what a source's selection would capture, read from the source without changing it.

Each source kind lists its candidates (sources/postgres/discover.py, sources/mongodb/discover.py)
as `Candidate`s; this module picks the sources and prints them, as a table or as one JSON document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ingest.config import Config, MongoSource, PostgresSource

EXIT_REFUSED = 8  # something selected would be refused by `run` (0: every selected table can be captured)
KIB = 1024
SIZE_UNITS = ("B", "kB", "MB", "GB", "TB")
NOT_KNOWN = "?"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One table (or collection) as discover reports it.

    `key`: the columns that key its records (primary key, or the replica identity's index);
    `key_kind`: where they come from (`primary key`, `replica identity index`, `every column`
    under REPLICA IDENTITY FULL without either, `none`). `rows`/`size_bytes`: the catalog's
    estimates (None: never analyzed, or not known). `refused`: why ingest would refuse the table,
    in the words it refuses it with; `notes`: what it would do short of refusing.
    """

    name: str
    selected: bool
    key: tuple[str, ...] = ()
    key_kind: str = "none"
    replica_identity: str | None = None
    rows: int | None = None
    size_bytes: int | None = None
    partitioned: bool = False
    partition_of: str | None = None
    published: bool | None = None
    refused: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Listing:
    """One source's candidates, and what is refused of the source as a whole (`server`)."""

    source: str
    kind: str
    where: str
    candidates: tuple[Candidate, ...]
    server: str | None = None
    notes: tuple[str, ...] = field(default=())

    def document(self) -> dict[str, Any]:
        """The source's object of `discover --json` (docs/configuration.md)."""
        out = asdict(self)
        out["tables"] = out.pop("candidates")
        return out


def discover(cfg: Config, source: str | None, every: bool) -> list[Listing]:
    """List the candidates of each source (or only `source`); `every`: all tables, not only selected ones."""
    out = []
    for src in [cfg.source(source)] if source else cfg.sources:
        if isinstance(src, PostgresSource):
            from ingest.sources.postgres.discover import discover_postgres

            out.append(discover_postgres(src, every))
        elif isinstance(src, MongoSource):
            from ingest.sources.mongodb.discover import discover_mongo

            out.append(discover_mongo(src, every))
    return out


def exit_code(listings: Sequence[Listing]) -> int:
    """0 when nothing selected is refused, else EXIT_REFUSED (a start would stop on it)."""
    refused = any(s.server for s in listings) or any(c.refused and c.selected for s in listings for c in s.candidates)
    return EXIT_REFUSED if refused else 0


def human_size(n: int | None) -> str:
    """`n` bytes as `12.3 MB` (powers of 1024); `?` when not known."""
    if n is None:
        return NOT_KNOWN
    size = float(n)
    for unit in SIZE_UNITS:
        if size < KIB or unit == SIZE_UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= KIB
    raise AssertionError("unreachable")


def _row(c: Candidate) -> list[str]:
    part = "partitioned" if c.partitioned else f"partition of {c.partition_of}" if c.partition_of else "-"
    published = "-" if c.published is None else "yes" if c.published else "no"
    status = "refused" if c.refused else "ok"
    return [
        c.name,
        "yes" if c.selected else "no",
        ", ".join(c.key) if c.key else f"({c.key_kind})",
        c.replica_identity or "-",
        NOT_KNOWN if c.rows is None else f"~{c.rows:,}",
        human_size(c.size_bytes),
        part,
        published,
        status,
    ]


HEADER = ["table", "selected", "key", "identity", "rows", "size", "partitioning", "published", "status"]


def lines(listing: Listing) -> list[str]:
    """The human report of one source: a heading, a table, then each refusal and note in full."""
    out = [f"source {listing.source} ({listing.kind}): {listing.where}"]
    if listing.server:
        out.append(f"  REFUSED: {listing.server}")
    out += [f"  note: {n}" for n in listing.notes]
    if not listing.candidates:
        out.append("  no table is selected")
        return out
    rows = [HEADER] + [_row(c) for c in listing.candidates]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    out += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for c in listing.candidates:
        if c.refused:
            out.append(f"  {c.name}: refused: {c.refused}")
        out += [f"  {c.name}: {n}" for n in c.notes]
    return out
