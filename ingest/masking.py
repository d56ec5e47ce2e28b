"""Columns that must never land in bronze: which a table excludes and masks, and the mask itself.

Bronze is forever (append-only, and copied into every silver and gold model), so a PII value that
lands once can never be taken back. Per table the config names `exclude_columns` (never written:
not in `record`, `old_record`, snapshot pages or the table's shape) and `mask_columns` (written as
a keyed hash, or as null). Sources apply these rules where they turn a row into bronze JSON; this
module holds the rules and the mask, and knows nothing of Postgres or MongoDB.

The mask is HMAC-SHA256 keyed with a secret salt read from the environment variable the config
names (`mask_salt_env`), written as 64 lowercase hex digits: equal values give equal hashes (joins
and distinct counts still work, across tables and sources that share the salt), and without the
salt a hash cannot be checked against guessed values (a plain hash of an e-mail address can).
What is hashed is the value's text: Postgres's text output of it, the string itself for a MongoDB
string, and its canonical Extended JSON for any other MongoDB value. NULL stays null.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ingest.errors import ConfigError, SourceError

log = logging.getLogger(__name__)

MASKED_JSON_KIND: Final = "masked"  # bronze.source_relations json_kind of a masked column
MIN_SALT_CHARS: Final = 16  # a shorter salt is guessable, and then so is every masked value


class MaskWith(StrEnum):
    """What a masked column holds in bronze."""

    HASH = "hash"  # HMAC-SHA256 of the value with the secret salt, hex
    NULL = "null"  # JSON null


def mask_hash(salt: bytes, value: bytes) -> str:
    """HMAC-SHA256 of `value` keyed with `salt`, as 64 lowercase hex digits."""
    return hmac.new(salt, value, hashlib.sha256).hexdigest()


def read_salt(env_var: str, where: str) -> bytes:
    """The salt held by environment variable `env_var`; ConfigError naming `where` if unset or short."""
    salt = os.environ.get(env_var)
    if not salt:
        raise ConfigError(
            f"{where}: environment variable {env_var} is not set; it must hold the secret salt of the "
            f"masked columns' hashes (at least {MIN_SALT_CHARS} characters, e.g. `openssl rand -hex 32`)"
        )
    if len(salt) < MIN_SALT_CHARS:
        raise ConfigError(f"{where}: the salt in {env_var} is shorter than {MIN_SALT_CHARS} characters")
    return salt.encode()


@dataclass(frozen=True, slots=True)
class TableMask:
    """The rules of one table: the columns it leaves out and the columns it masks, and how.

    `salt` is None when `mask_with` is null (nothing is hashed).
    """

    exclude: frozenset[str]
    mask: frozenset[str]
    mask_with: MaskWith
    salt: bytes | None
    # Masked names the table no longer has because their column was renamed: the rule followed it
    # (`follow_renames`), so check_names does not refuse them.
    followed: frozenset[str] = frozenset()

    def touches(self, columns: Iterable[str]) -> list[str]:
        """Which of `columns` this table excludes or masks (in the given order)."""
        return [c for c in columns if c in self.exclude or c in self.mask]

    def check_key(self, table: str, key: Iterable[str], source: str) -> None:
        """Refuse excluding or masking a key column: `record_pk` must identify the row.

        A hashed key would still identify it, but snapshots keep the key's source text as their
        keyset cursor (`snapshot_pages.key_text`) and re-reads look rows up by key, so the value
        would land anyway; so the rule is simply no.
        """
        bad = self.touches(key)
        if bad:
            raise ConfigError(
                f"sources.{source}: table {table}: {', '.join(bad)} is part of the row's key (the primary key, "
                "or every column of a table keyed by REPLICA IDENTITY FULL), which record_pk must carry as it "
                "is: it cannot be excluded or masked"
            )

    def named(self) -> frozenset[str]:
        """Every column name the rules name, excluded or masked."""
        return self.exclude | self.mask

    def check_names(self, table: str, columns: Sequence[str], source: str) -> None:
        """Refuse a rule naming a column `table` does not have (`columns`: the table's columns now).

        Rules match columns by name, so a typo, a case mismatch or a column renamed since would
        match nothing and its values would land as they are: refused, naming the columns the table
        has (and the near miss, if there is one), before anything of the table is written.
        """
        unknown = sorted(self.named() - set(columns) - self.followed)
        if not unknown:
            return
        lower = {c.lower(): c for c in columns}
        hints = [
            f"{n} (did you mean {lower[n.lower()]}? names are case-sensitive)" for n in unknown if n.lower() in lower
        ]
        what = "; ".join(hints) if hints else ", ".join(unknown)
        raise SourceError(
            f"source {source!r}: table {table}: exclude_columns/mask_columns name {what}, which the table does not "
            f"have (its columns: {', '.join(columns)}). A rule that matches no column would let the column's values "
            "land as they are: fix the name and run again (a masked column renamed since is followed only when bronze "
            "recorded it, with its attnum, and only by `run`, which reads bronze; an excluded one never is: list it "
            "under its new name)"
        )

    def follow_renames(
        self, table: str, now: Mapping[str, int], recorded: Iterable[tuple[str, int, bool]], source: str
    ) -> TableMask:
        """These rules with each masked column that was renamed masked under its new name too.

        `now`: the table's columns now, name -> attnum; `recorded`: (name, attnum, masked) of every
        column a recorded shape of this very relation holds. A column keeps its attnum for life (a
        rename keeps it, a dropped column's is never reused), so a column recorded under a name a
        mask rule names is that rule's column whatever it is called now, when it was recorded
        masked, or when the rule's name is no column of the table now (renamed away before any
        shape recorded it masked): its new name is masked (and the old one stays in the rules:
        older changes carry it), with a warning naming both names, as the config should say the
        new one. `drop d; rename email to d; add email` masks d (the former email) and the new email
        both. A name recorded under several attnums (dropped and added again) follows each. Excluded
        columns are never in a recorded shape (that is what excluding them means), so an excluded
        column's rule does not follow: check_names refuses it.
        """
        by_attnum = {a: n for n, a in now.items()}
        moved: dict[str, str] = {}
        for then, attnum, masked in recorded:
            name = by_attnum.get(attnum)
            if then not in self.mask or name is None or name == then or name in self.mask:
                continue
            if masked or then not in now:
                moved[name] = then
        if not moved:
            return self
        for name, then in sorted(moved.items()):
            log.warning(
                "source=%s table=%s: masked column %s was renamed to %s (the same column, attnum %d): it stays masked "
                "under its new name%s. Update the config: list %s in mask_columns (keyed by the new name)",
                source,
                table,
                then,
                name,
                now[name],
                f", and the new column {then} is masked by the rule's name" if then in now else "",
                name,
            )
        return TableMask(
            self.exclude,
            self.mask | frozenset(moved),
            self.mask_with,
            self.salt,
            self.followed | frozenset(t for t in moved.values() if t not in now),
        )

    def check_fields(self, where: str, fields: Iterable[str]) -> None:
        """Refuse a field named like a rule's name except for case (`fields`: a document's top-level fields).

        For a source without a schema (MongoDB): rules match field names exactly, so a rule naming
        `Email` leaves the `email` documents carry to land as they are, and no catalog says so
        beforehand. Checked on each document before anything of it is written: SourceError naming
        `where` (the collection), the rule and the field. A field a rule names itself is ruled.
        """
        named = self.named()
        folded: dict[str, str] | None = None
        for field in fields:
            if field in named:
                continue
            if folded is None:
                folded = {n.casefold(): n for n in named}
            rule = folded.get(field.casefold())
            if rule is not None:
                which = "mask_columns" if rule in self.mask else "exclude_columns"
                raise SourceError(
                    f"collection {where}: a document has field {field!r}, which {which} names only as {rule!r} "
                    "(names are case-sensitive, so the rule does not cover it and its values would land as they "
                    f"are). Nothing of it was written and the stream does not go past it: list {field} in {which} "
                    "too (or instead) and run again"
                )

    def for_relation(
        self, table: str, sent: Sequence[str], now: Sequence[str], source: str, key: Sequence[str] = ()
    ) -> TableMask:
        """The rules as they apply to changes carrying columns `sent` while the table has columns `now`.

        Every named column must exist now (check_names). One the changes lack was added or renamed
        since they were written (old WAL). A column they carry that the table no longer has was
        dropped or renamed since: it may be a ruled column under its former name (renamed, and the
        rule moved to the new name; or dropped, and the rule removed with it), so it is masked too
        (a hash or null instead of a value that might be a secret), with a warning; excluded
        instead when the columns the changes lack are all excluded ones. Key columns (`key`) stay.
        """
        self.check_names(table, now, source)
        former = frozenset(c for c in sent if c not in now and c not in self.named() and c not in key)
        if not former:
            return self
        lacking = self.named() - set(sent)
        exclude = bool(lacking) and lacking <= self.exclude  # an excluded column's former name stays out
        log.warning(
            "source=%s table=%s: these changes were written before a schema change and carry column(s) %s, which "
            "the table no longer has (dropped or renamed since; the rules name %s): %s, as they may be a ruled "
            "column under its former name",
            source,
            table,
            ", ".join(sorted(former)),
            ", ".join(sorted(self.named())),
            "excluded" if exclude else "masked",
        )
        if exclude:
            return TableMask(self.exclude | former, self.mask, self.mask_with, self.salt, self.followed)
        return TableMask(self.exclude, self.mask | former, self.mask_with, self.salt, self.followed)

    def encoder(self) -> Callable[[bytes], str]:
        """The JSON fragment of a masked value given as its text bytes (a Postgres value encoder)."""
        if self.mask_with is MaskWith.NULL or self.salt is None:
            return _null_fragment
        salt = self.salt
        return lambda value: '"' + mask_hash(salt, value) + '"'

    def mask_text(self, text: str) -> str | None:
        """The masked value of a value given as text: its hash, or None for `null`."""
        if self.mask_with is MaskWith.NULL or self.salt is None:
            return None
        return mask_hash(self.salt, text.encode())


def _null_fragment(_value: bytes) -> str:
    return "null"


def _names_kept_their_columns(before: Sequence[str], now: Sequence[str]) -> bool:
    """Whether `before` -> `now` (a table's column names, in column order) can be told without a rename.

    A column keeps its place (attnum) for life and a new one comes after every existing one, so
    without a rename the names both lists have keep their order, and every new name comes after
    them. A name that broke either rule now belongs to another column than it did.
    """
    old = set(before)
    common = [c for c in now if c in old]
    if common != [c for c in before if c in set(now)]:
        return False
    last_common = max((i for i, c in enumerate(now) if c in old), default=-1)
    return all(c in old for c in now[: last_common + 1])


def check_masks_followed(
    table: str,
    before: Sequence[tuple[str, bool, int | None]],
    now: Sequence[tuple[str, bool, int | None]],
    table_dropped_columns: bool,
    source: str,
) -> None:
    """Refuse a shape change that may have moved a masked column's values under a name no rule masks.

    `before`: the last recorded shape's (name, masked, attnum) in column order; `now`: the same for
    the table as the current rules see it (attnum None where a shape does not carry it). The rules
    follow a renamed masked column by the attnum bronze recorded it masked at
    (TableMask.follow_renames), so `now` normally has it masked under its new name; this check is
    the backstop for what could not follow (a shape recorded without attnums), where renaming a
    masked column and giving its name to another (a new column, or a swap) would leave the rule
    matching a column and the values it was written for landing as they are, in the stream and in
    the re-snapshot the rename asks for.

    When every column of both shapes carries its attnum (a column's identity for life: a rename
    keeps it, a dropped column's number is never reused), each column that was masked and is still
    in the table under another name must be masked now (under its own name, an unmasked one had its
    rule taken off, as the config says): `drop d; rename email to d; add email`
    leaves every name in its place and is told only this way. Else (a shape recorded before
    attnums were, or one the catalog had changed under when it was met) by names and places: when
    the names cannot all have kept their columns (`_names_kept_their_columns`), with no column ever
    dropped from the table the n-th column is the n-th column then, and each formerly masked one
    must be masked now. With dropped columns places do not tell: the change passes only when no
    two names swapped and every name that is new since is masked.
    """
    was_masked = [n for n, masked, _a in before if masked]
    if not was_masked:
        return
    how = (
        "list the column under its new name in mask_columns (or exclude_columns) and run again; "
        "nothing of the new shape was written"
    )
    if all(a is not None for _n, _m, a in (*before, *now)):
        by_attnum = {a: (n, masked) for n, masked, a in now}
        for then, was, attnum in before:
            # Gone (dropped, or excluded now): nothing of it lands. Under its own name: the rule was
            # taken off on purpose, which unmasks it as the config says.
            name, is_masked = by_attnum.get(attnum, (then, True))
            if was and not is_masked and name != then:
                raise SourceError(_unmasked(source, table, then, name, how))
        return
    names_then, names_now = [n for n, _m, _a in before], [n for n, _m, _a in now]
    if _names_kept_their_columns(names_then, names_now):
        return
    if table_dropped_columns or len(now) < len(before):
        old, masked_now = set(names_then), {n for n, masked, _a in now if masked}
        common = [n for n in names_now if n in old]
        if common == [n for n in names_then if n in set(names_now)] and all(
            n in masked_now for n in names_now if n not in old
        ):
            return  # no two names swapped, and every name the table did not have then is masked
        raise SourceError(
            f"source {source!r}: table {table}: columns were renamed ({', '.join(names_then)} -> "
            f"{', '.join(names_now)}) and masked column {', '.join(was_masked)} may now go by another name; the table "
            "has dropped columns, so which name is which column cannot be told. That is only accepted when every "
            "column whose name is new since is masked and no name moved to another column's place (otherwise capture "
            f"the table as a new source); {how}"
        )
    for (then, was, _a), (name, is_masked, _b) in zip(before, now, strict=False):
        if was and not is_masked:
            raise SourceError(_unmasked(source, table, then, name, how))


def _unmasked(source: str, table: str, then: str, name: str, how: str) -> str:
    """The error of masked column `then`, now named `name`, which no rule masks."""
    return (
        f"source {source!r}: table {table}: column {then} (masked) was renamed to {name}, which no rule masks "
        f"(rules match names; the column's values would land as they are): {how}"
    )


class SourceMasks:
    """The rules of one source, by table (`schema.table`, or a MongoDB collection's name)."""

    def __init__(self, tables: Mapping[str, TableMask]) -> None:
        """Keep the rules of the tables that have any."""
        self._tables = {t: m for t, m in tables.items() if m.exclude or m.mask}

    def __bool__(self) -> bool:
        """Whether any table of the source excludes or masks a column."""
        return bool(self._tables)

    def table(self, name: str) -> TableMask | None:
        """The rules of table `name`, None if it has none (the unmasked path: no cost)."""
        return self._tables.get(name)

    @classmethod
    def build(
        cls,
        source: str,
        columns: Mapping[str, tuple[Iterable[str], Iterable[str]]],
        mask_with: str,
        salt_env: str | None,
    ) -> SourceMasks:
        """Rules from the config: `columns` maps a table to its (exclude_columns, mask_columns).

        Reads the salt from `salt_env` when some column is masked with `hash` (ConfigError if unset).
        """
        how = MaskWith(mask_with)
        masks_any = any(list(m) for _e, m in columns.values())
        salt = None
        if masks_any and how is MaskWith.HASH:
            if salt_env is None:
                raise ConfigError(
                    f"sources.{source}.mask_salt_env: required when mask_columns are set with mask_with: hash "
                    "(the environment variable holding the hash's secret salt)"
                )
            salt = read_salt(salt_env, f"sources.{source}.mask_salt_env")
        return cls({t: TableMask(frozenset(e), frozenset(m), how, salt) for t, (e, m) in columns.items()})
