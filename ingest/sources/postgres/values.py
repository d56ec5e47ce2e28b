"""Map pgoutput text-format column values to JSON text per the docs/bronze.md value table.

Somewhat over our ~300-line norm: the type table (a JSON mapping per built-in type OID), the
scalar encoders and the array-literal parser are one mapping, and the catalog that picks an
encoder per column needs all three. Putting a row together is `rows.py`'s.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ingest.errors import IngestError

Encoder = Callable[[bytes], str]
"""Turns one column's text-format value bytes into a JSON fragment."""

StrEncoder = Callable[[str], str]
"""Turns one decoded text value (e.g. an array element) into a JSON fragment."""

ArrayItems = list["str | None | ArrayItems"]
"""A parsed array literal: elements (None for NULL) and nested sub-arrays."""

# One row per type; the adapter runs this and passes the rows to TypeCatalog. The optional 7th
# column `typdelim` is the element delimiter of arrays of that type (';' for box, else ',').
TYPE_CATALOG_SQL: Final = (
    "select t.oid::int8, t.typname::text, t.typtype::text, t.typbasetype::int8, "
    "t.typelem::int8, t.typcategory::text, t.typdelim::text from pg_catalog.pg_type as t"
)

KIND_INT: Final = "int"
KIND_FLOAT: Final = "float"
KIND_NUMERIC: Final = "numeric"
KIND_BOOL: Final = "bool"
KIND_TEXT: Final = "text"
KIND_TEMPORAL: Final = "temporal"
KIND_JSON: Final = "json"
KIND_BYTEA: Final = "bytea"
KIND_ARRAY: Final = "array"
KIND_OTHER: Final = "other"

TYPTYPE_DOMAIN: Final = "d"
TYPTYPE_ENUM: Final = "e"
TYPCATEGORY_ARRAY: Final = "A"

# Built-in type OIDs are fixed across PostgreSQL versions (pg_type.dat).
_KIND_BY_OID: Final[dict[int, str]] = {
    16: KIND_BOOL,
    17: KIND_BYTEA,
    18: KIND_TEXT,  # "char"
    19: KIND_TEXT,  # name
    20: KIND_INT,
    21: KIND_INT,
    23: KIND_INT,
    25: KIND_TEXT,
    26: KIND_INT,  # oid
    114: KIND_JSON,
    700: KIND_FLOAT,
    701: KIND_FLOAT,
    1042: KIND_TEXT,  # bpchar
    1043: KIND_TEXT,  # varchar
    1082: KIND_TEMPORAL,  # date
    1083: KIND_TEMPORAL,  # time
    1114: KIND_TEMPORAL,  # timestamp
    1184: KIND_TEMPORAL,  # timestamptz
    1186: KIND_TEMPORAL,  # interval
    1266: KIND_TEMPORAL,  # timetz
    1700: KIND_NUMERIC,
    2950: KIND_TEXT,  # uuid
    3802: KIND_JSON,  # jsonb
}
# Array type OID -> element type OID, for when no catalog rows were loaded.
_BUILTIN_ARRAYS: Final[dict[int, int]] = {
    1000: 16, 1001: 17, 1002: 18, 1003: 19, 1016: 20, 1005: 21, 1007: 23, 1009: 25, 1028: 26,
    199: 114, 1021: 700, 1022: 701, 1014: 1042, 1015: 1043, 1182: 1082, 1183: 1083, 1115: 1114,
    1185: 1184, 1187: 1186, 1270: 1266, 1231: 1700, 2951: 2950, 3807: 3802, 1020: 603,
}  # fmt: skip
# int2vector and oidvector are category 'A' but print as space-separated lists: plain strings.
_VECTOR_OIDS: Final = frozenset({22, 30})
_BOX_OID: Final = 603
_CITEXT: Final = "citext"

_ARRAY_SPACE: Final = frozenset(" \t\n\r\v\f")
_NULL_LITERAL: Final = "null"

json_str: Final[StrEncoder] = json.encoder.encode_basestring  # = json.dumps(s, ensure_ascii=False)

_FLOAT_SPECIAL: Final[dict[str, str]] = {
    "NaN": '"NaN"',
    "Infinity": '"Infinity"',
    "-Infinity": '"-Infinity"',
}
_BOOL_JSON: Final[dict[str, str]] = {"t": "true", "f": "false"}


class ValueMappingError(IngestError):
    """A row could not be encoded to JSON; the message names the table and, where known, the column.

    A value does not map (malformed array literal, bad bool, non-UTF-8), the row's width is not its
    relation's, or a key column is an unchanged TOAST value the change carries no old value of.
    """


@dataclass(frozen=True, slots=True)
class PgType:
    """One pg_type row: what TypeCatalog needs to pick a JSON mapping."""

    oid: int
    name: str
    typtype: str
    basetype: int
    elem: int
    category: str
    delim: str = ","


def _str_int(text: str) -> str:
    return text


def _str_float(text: str) -> str:
    return _FLOAT_SPECIAL.get(text, text)


def _str_bool(text: str) -> str:
    try:
        return _BOOL_JSON[text]
    except KeyError:
        raise ValueMappingError(f"boolean value {text!r} is neither 't' nor 'f'") from None


def _bytes_int(value: bytes) -> str:
    return value.decode("ascii")


def _bytes_float(value: bytes) -> str:
    text = value.decode("ascii")
    return _FLOAT_SPECIAL.get(text, text)


def _bytes_bool(value: bytes) -> str:
    return _str_bool(value.decode("ascii"))


def _bytes_str(value: bytes) -> str:
    return json_str(value.decode("utf-8"))


def non_utf8_tolerant(encoder: Encoder, policy: str) -> Encoder:
    """`encoder`, taking a value that is not UTF-8 as the source's `non_utf8` policy says (C6).

    `error`: the encoder as it is (its UnicodeDecodeError becomes an error naming the table and
    column, rows.py). `replace` / `latin1`: the value is first re-encoded as UTF-8, each invalid
    byte replaced by U+FFFD, or every byte read as a Latin-1 character; only a value that failed
    takes that path, so UTF-8 values cost nothing more than a call.
    """
    if policy == "error":
        return encoder
    if policy == "replace":

        def fix(value: bytes) -> bytes:
            return value.decode("utf-8", errors="replace").encode("utf-8")

    elif policy == "latin1":

        def fix(value: bytes) -> bytes:
            return value.decode("latin-1").encode("utf-8")

    else:
        raise ValueError(f"non_utf8 policy {policy!r} is not one of error, replace, latin1")

    def tolerant(value: bytes) -> str:
        try:
            return encoder(value)
        except UnicodeDecodeError:
            return encoder(fix(value))

    return tolerant


_SCALAR_ENCODERS: Final[dict[str, tuple[Encoder, StrEncoder]]] = {
    KIND_INT: (_bytes_int, _str_int),
    KIND_FLOAT: (_bytes_float, _str_float),
    KIND_BOOL: (_bytes_bool, _str_bool),
}
_STRING_ENCODERS: Final[tuple[Encoder, StrEncoder]] = (_bytes_str, json_str)


def parse_array_literal(text: str, delim: str = ",") -> ArrayItems:
    """Parse a PostgreSQL array literal (`array_out` text) into nested lists of element strings.

    Handles double quotes, backslash escapes, unquoted NULL (any case) as None, nested
    dimensions and an optional `[lo:hi]...=` bounds prefix (dropped). Raises ValueMappingError
    with the offset on malformed input.
    """
    n = len(text)
    i = 0
    while i < n and text[i] in _ARRAY_SPACE:
        i += 1
    if i < n and text[i] == "[":
        eq = text.find("=", i)
        if eq < 0:
            raise ValueMappingError(f"array literal {text[:60]!r}: bounds prefix without '='")
        i = eq + 1
        while i < n and text[i] in _ARRAY_SPACE:
            i += 1
    if i >= n or text[i] != "{":
        raise ValueMappingError(f"array literal {text[:60]!r} does not start with '{{'")
    items, i = _parse_level(text, i + 1, delim)
    while i < n and text[i] in _ARRAY_SPACE:
        i += 1
    if i != n:
        raise ValueMappingError(f"array literal {text[:60]!r}: junk after '}}' at offset {i}")
    return items


def _parse_level(text: str, i: int, delim: str) -> tuple[ArrayItems, int]:
    """Parse elements after a '{' at `i`; return them and the offset after the matching '}'."""
    items: ArrayItems = []
    n = len(text)
    try:
        while text[i] in _ARRAY_SPACE:
            i += 1
        if text[i] == "}":
            return items, i + 1
        while True:
            while text[i] in _ARRAY_SPACE:
                i += 1
            ch = text[i]
            if ch == "{":
                sub, i = _parse_level(text, i + 1, delim)
                items.append(sub)
            elif ch == '"':
                chars: list[str] = []
                i += 1
                while (ch := text[i]) != '"':
                    if ch == "\\":
                        i += 1
                        ch = text[i]
                    chars.append(ch)
                    i += 1
                i += 1
                items.append("".join(chars))
            else:
                chars = []
                keep = 0
                escaped = False
                while (ch := text[i]) != delim and ch != "}":
                    if ch == "\\":
                        i += 1
                        chars.append(text[i])
                        keep = len(chars)
                        escaped = True
                    elif ch == '"' or ch == "{":
                        raise ValueMappingError(f"array literal {text[:60]!r}: unexpected {ch!r} at offset {i}")
                    else:
                        chars.append(ch)
                        if ch not in _ARRAY_SPACE:
                            keep = len(chars)
                    i += 1
                if keep == 0 and not escaped:
                    raise ValueMappingError(f"array literal {text[:60]!r}: empty unquoted element at offset {i}")
                value = "".join(chars[:keep])
                items.append(None if not escaped and value.lower() == _NULL_LITERAL else value)
            while text[i] in _ARRAY_SPACE:
                i += 1
            ch = text[i]
            i += 1
            if ch == "}":
                return items, i
            if ch != delim:
                raise ValueMappingError(f"array literal {text[:60]!r}: expected {delim!r} or '}}' at offset {i - 1}")
    except IndexError:
        raise ValueMappingError(
            f"array literal {text[:60]!r} ends early (length {n}): unbalanced '{{' or '\"'"
        ) from None


def _render_array(items: ArrayItems, element: StrEncoder) -> str:
    parts = []
    for item in items:
        if item is None:
            parts.append("null")
        elif isinstance(item, list):
            parts.append(_render_array(item, element))
        else:
            parts.append(element(item))
    return "[" + ",".join(parts) + "]"


class TypeCatalog:
    """Resolves type OIDs to JSON mappings and builds cached per-type value encoders.

    Responsibilities: follow domains to their base type and arrays to their element type,
    name the mapping (`json_kind`), and hand out encoders (`column_encoder`). Built from
    TYPE_CATALOG_SQL rows; OIDs it does not know fall back to the built-in table, then to
    "string of the Postgres text output".
    """

    __slots__ = ("_types", "_encoders")

    def __init__(self, types: Iterable[PgType] = ()) -> None:
        """Index `types` by OID (later rows win)."""
        self._types: dict[int, PgType] = {t.oid: t for t in types}
        self._encoders: dict[int, tuple[Encoder, StrEncoder]] = {}

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> TypeCatalog:
        """Build from TYPE_CATALOG_SQL rows.

        Each row is (oid, typname, typtype, typbasetype, typelem, typcategory[, typdelim]).
        """
        return cls(PgType(int(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), str(r[5]), *r[6:7]) for r in rows)

    def base_type(self, type_oid: int) -> int:
        """Follow domains to their base type; return `type_oid` itself for a non-domain."""
        seen = set()
        while (t := self._types.get(type_oid)) is not None and t.typtype == TYPTYPE_DOMAIN:
            if type_oid in seen:
                raise ValueMappingError(f"domain cycle in type catalog at OID {type_oid}")
            seen.add(type_oid)
            type_oid = t.basetype
        return type_oid

    def element_type(self, type_oid: int) -> int | None:
        """Return the element OID if `type_oid` (after domains) is an array type, else None."""
        base = self.base_type(type_oid)
        t = self._types.get(base)
        if t is None:
            return _BUILTIN_ARRAYS.get(base)
        if t.category == TYPCATEGORY_ARRAY and t.elem != 0 and base not in _VECTOR_OIDS:
            return t.elem
        return None

    def json_kind(self, type_oid: int) -> str:
        """Name the JSON mapping of a type (bronze `json_kind`).

        One of int, float, numeric, bool, text, temporal, json, bytea, array or other; text,
        temporal and other all become JSON strings.
        """
        base = self.base_type(type_oid)
        kind = _KIND_BY_OID.get(base)
        if kind is not None:
            return kind
        if self.element_type(base) is not None:
            return KIND_ARRAY
        t = self._types.get(base)
        if t is not None and (t.typtype == TYPTYPE_ENUM or t.name == _CITEXT):
            return KIND_TEXT
        return KIND_OTHER

    def column_encoder(self, type_oid: int) -> Encoder:
        """Return an encoder from the column's text-format bytes to a JSON fragment (cached)."""
        return self._pair(type_oid, frozenset())[0]

    def _pair(self, type_oid: int, visiting: frozenset[int]) -> tuple[Encoder, StrEncoder]:
        cached = self._encoders.get(type_oid)
        if cached is not None:
            return cached
        if type_oid in visiting:
            raise ValueMappingError(f"array element cycle in type catalog at OID {type_oid}")
        kind = self.json_kind(type_oid)
        if kind == KIND_ARRAY:
            elem = self.element_type(type_oid)
            assert elem is not None
            pair = self._array_pair(elem, self._pair(elem, visiting | {type_oid})[1])
        else:
            pair = _SCALAR_ENCODERS.get(kind, _STRING_ENCODERS)
        self._encoders[type_oid] = pair
        return pair

    def _array_pair(self, elem: int, element: StrEncoder) -> tuple[Encoder, StrEncoder]:
        elem_type = self._types.get(self.base_type(elem))
        delim = elem_type.delim if elem_type is not None else ";" if elem == _BOX_OID else ","

        def encode_str(text: str) -> str:
            if not text or text[0] not in "{[":  # not an array literal: keep the text
                return json_str(text)
            return _render_array(parse_array_literal(text, delim), element)

        def encode_bytes(value: bytes) -> str:
            return encode_str(value.decode("utf-8"))

        return encode_bytes, encode_str
