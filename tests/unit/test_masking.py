"""The mask (HMAC-SHA256 with a secret salt) and the config of columns that must never land (issue 17)."""

from __future__ import annotations

import hashlib
import hmac
import re

import pytest

from ingest.config import PostgresSource, parse_config
from ingest.errors import ConfigError, SourceError
from ingest.masking import MaskWith, SourceMasks, TableMask, mask_hash

SALT_ENV = "CHANGELAKE_TEST_MASK_SALT"
SALT = "0123456789abcdef-salt"
BASE = """
sources:
  - name: shop
    kind: postgres
    dsn: postgresql://h/db
"""


def _pg(extra: str) -> PostgresSource:
    src = parse_config(BASE + extra).sources[0]
    assert isinstance(src, PostgresSource)
    return src


def test_same_input_and_salt_give_the_same_hash() -> None:
    h = mask_hash(b"salt-one-0123456789", b"a@example.org")
    assert h == mask_hash(b"salt-one-0123456789", b"a@example.org")
    assert len(h) == 64 and int(h, 16) >= 0
    assert h == hmac.new(b"salt-one-0123456789", b"a@example.org", hashlib.sha256).hexdigest()


def test_a_different_salt_or_value_gives_another_hash() -> None:
    h = mask_hash(b"salt-one-0123456789", b"a@example.org")
    assert h != mask_hash(b"salt-two-0123456789", b"a@example.org")
    assert h != mask_hash(b"salt-one-0123456789", b"b@example.org")
    assert h != hashlib.sha256(b"a@example.org").hexdigest()  # keyed: not a plain hash anyone can recompute


def test_encoder_writes_a_json_string_or_null() -> None:
    hashed = TableMask(frozenset(), frozenset({"email"}), MaskWith.HASH, b"s" * 16)
    assert hashed.encoder()(b"x") == '"' + mask_hash(b"s" * 16, b"x") + '"'
    nulled = TableMask(frozenset(), frozenset({"email"}), MaskWith.NULL, None)
    assert nulled.encoder()(b"x") == "null" and nulled.mask_text("x") is None


def test_both_table_forms_give_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SALT_ENV, SALT)
    inline = _pg(
        "    tables: [public.orders, {name: public.people, exclude_columns: [ssn], mask_columns: [email]}]\n"
        f"    mask_salt_env: {SALT_ENV}\n"
    )
    mapping = _pg(
        "    tables: [public.orders, public.people]\n"
        "    columns: {public.people: {exclude_columns: [ssn], mask_columns: [email]}}\n"
        f"    mask_salt_env: {SALT_ENV}\n"
    )
    assert inline.tables == mapping.tables == ["public.orders", "public.people"]
    assert inline.columns == mapping.columns
    masks = inline.masks()
    assert masks.table("public.orders") is None
    people = masks.table("public.people")
    assert people is not None and people.exclude == {"ssn"} and people.mask == {"email"}
    assert people.salt == SALT.encode()


def test_plain_tables_need_no_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SALT_ENV, raising=False)
    src = _pg("    tables: [public.orders, {name: public.people, exclude_columns: [ssn]}]\n")
    assert not src.masks().table("public.people").mask  # type: ignore[union-attr]
    assert not _pg("    tables: [public.orders]\n").masks()


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ("    tables: [{name: public.p, mask_columns: [email]}]\n", r"mask_salt_env: required when mask_columns"),
        (
            f"    tables: [{{name: public.p, mask_columns: [email]}}]\n    mask_salt_env: {SALT_ENV}\n",
            rf"mask_salt_env: environment variable {SALT_ENV} is not set",
        ),
        ("    tables: [{exclude_columns: [a]}]\n", r"tables\.0: a mapping entry needs `name: schema.table`"),
        ("    tables: [{name: public.p, exclude_colums: [a]}]\n", r"columns\.public\.p\.exclude_colums: unknown key"),
        (
            "    tables: [{name: public.p, exclude_columns: [a], mask_columns: [a]}]\n    mask_with: 'null'\n",
            r"a: in both exclude_columns and mask_columns",
        ),
        ("    tables: [{name: public.p, exclude_columns: [a, a]}]\n", r"exclude_columns: a column is listed twice"),
        ("    tables: [public.p]\n    columns: {public.q: {exclude_columns: [a]}}\n", r"public\.q is not one of"),
        (
            "    tables: [{name: public.p, exclude_columns: [a]}]\n    columns: {public.p: {exclude_columns: [b]}}\n",
            r"public\.p has column rules here and under `columns:`",
        ),
        ("    tables: [public.p]\n    mask_with: hashed\n", r"mask_with: Input should be 'hash' or 'null'"),
    ],
)
def test_config_errors_name_the_key(monkeypatch: pytest.MonkeyPatch, extra: str, error: str) -> None:
    monkeypatch.delenv(SALT_ENV, raising=False)
    with pytest.raises(ConfigError, match=error):
        parse_config(BASE + extra)


def test_a_short_salt_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SALT_ENV, "short")
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        _pg(f"    tables: [{{name: public.p, mask_columns: [e]}}]\n    mask_salt_env: {SALT_ENV}\n")


def test_mask_with_null_needs_no_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SALT_ENV, raising=False)
    src = _pg("    tables: [{name: public.p, mask_columns: [e]}]\n    mask_with: 'null'\n")
    mask = src.masks().table("public.p")
    assert mask is not None and mask.mask_with is MaskWith.NULL and mask.salt is None


def test_a_key_column_is_refused() -> None:
    mask = TableMask(frozenset({"ssn"}), frozenset({"id"}), MaskWith.NULL, None)
    with pytest.raises(ConfigError, match=r"table public\.p: id is part of the row's key"):
        mask.check_key("public.p", ["id"], "shop")
    mask.check_key("public.p", ["other"], "shop")


def test_mongodb_id_is_refused_and_collections_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    base = "sources:\n  - {name: m, kind: mongodb, uri: 'mongodb://h', database: shop"
    with pytest.raises(ConfigError, match=r"_id is the key"):
        parse_config(base + ", collections: [{name: c, exclude_columns: [_id]}]}\n")
    with pytest.raises(ConfigError, match=r"columns: d is not one of the source's collections"):
        parse_config(base + ", collections: [c], columns: {d: {exclude_columns: [x]}}}\n")
    src = parse_config(base + ", columns: {d: {exclude_columns: [x]}}}\n").sources[0]  # every collection
    assert src.collections is None and src.masks().table("d") is not None


def test_source_masks_without_rules_is_empty() -> None:
    masks = SourceMasks({"public.p": TableMask(frozenset(), frozenset(), MaskWith.HASH, None)})
    assert not masks and masks.table("public.p") is None


def test_a_rule_naming_no_column_is_refused_with_the_near_miss() -> None:
    """A typo or case mismatch in a rule matched nothing and the column's values landed as they were."""
    mask = TableMask(frozenset({"ssn"}), frozenset({"Email"}), MaskWith.NULL, None)
    with pytest.raises(SourceError, match=r"name Email \(did you mean email\? names are case-sensitive\)"):
        mask.check_names("public.p", ["id", "ssn", "email"], "shop")
    with pytest.raises(SourceError, match=r"name ssn, which the table does not have \(its columns: id, email\)"):
        TableMask(frozenset({"ssn"}), frozenset(), MaskWith.NULL, None).check_names("public.p", ["id", "email"], "s")
    mask.check_names("public.p", ["id", "ssn", "Email"], "shop")


def test_a_renamed_masked_column_is_refused_until_the_rule_follows_it() -> None:
    """A RENAME COLUMN of a masked column left the rule matching nothing: the new name landed in plain text.

    Refused when nothing recorded the column masked with its attnum (else the rule follows it:
    test_mask_follows.py).
    """
    mask = TableMask(frozenset(), frozenset({"email"}), MaskWith.HASH, b"s" * 16)
    with pytest.raises(SourceError, match=r"name email, which the table does not have"):
        mask.for_relation("public.p", ["id", "email_address"], ["id", "email_address"], "shop")


def test_old_changes_mask_a_column_the_table_no_longer_has() -> None:
    """Old WAL carries a ruled column under its former name (renamed, or dropped and the rule removed)."""
    renamed = TableMask(frozenset(), frozenset({"email_address"}), MaskWith.HASH, b"s" * 16)
    now = ["id", "email_address"]
    assert renamed.for_relation("public.p", now, now, "shop") is renamed
    carried = renamed.for_relation("public.p", ["id", "email"], now, "shop", key=["id"])
    assert carried.mask == {"email", "email_address"} and not carried.exclude
    excluded = TableMask(frozenset({"social"}), frozenset({"email"}), MaskWith.NULL, None)
    carried = excluded.for_relation("public.p", ["id", "ssn", "email"], ["id", "social", "email"], "shop")
    assert carried.exclude == {"social", "ssn"} and carried.mask == {"email"}
    dropped = excluded.for_relation("public.p", ["id", "notes", "social", "email"], ["id", "social", "email"], "s")
    assert dropped.mask == {"email", "notes"}  # dropped since: the rule for it may have gone with it
    key_renamed = renamed.for_relation("public.p", ["key", "email_address"], now, "shop", key=["key"])
    assert key_renamed is renamed  # a key column renamed since stays the key (never masked)


@pytest.mark.parametrize("name", ["profile.email", "a.b.c"])
def test_mongodb_dotted_paths_are_refused(name: str) -> None:
    """A dotted path matched no top-level field and the nested value landed as it was."""
    base = "sources:\n  - {name: m, kind: mongodb, uri: 'mongodb://h', database: shop"
    with pytest.raises(ConfigError, match=rf"{re.escape(name)} is a path into a document.*\({name.split('.')[0]}\)"):
        parse_config(base + f", collections: [{{name: c, mask_columns: ['{name}']}}], mask_with: 'null'}}\n")


def test_a_field_named_like_a_rule_except_for_case_is_refused() -> None:
    """A MongoDB rule naming `Email` while documents carry `email` was accepted, and `email` landed in plaintext."""
    mask = TableMask(frozenset({"SSN"}), frozenset({"Email"}), MaskWith.HASH, b"s" * 16)
    with pytest.raises(SourceError, match=r"collection app\.users: a document has field 'email', which mask_columns "):
        mask.check_fields("app.users", ["_id", "email", "n"])
    with pytest.raises(SourceError, match=r"field 'ssn', which exclude_columns names only as 'SSN'"):
        mask.check_fields("app.users", ["_id", "ssn"])
    mask.check_fields("app.users", ["_id", "Email", "SSN", "n"])  # exactly as named
    mask.check_fields("app.users", [])
    both = TableMask(frozenset(), frozenset({"Email", "email"}), MaskWith.NULL, None)
    both.check_fields("app.users", ["email", "Email"])  # a field a rule names is ruled, whatever others look like
