"""Encode one Postgres row as bronze JSON: `record` and `record_pk`, for the stream and snapshots alike.

The value of each column is mapped by `values.py` (the encoder TypeCatalog gives its type); this
module puts a row together, and holds the rules about rows: width, NULL and unchanged-TOAST
columns, and where an unchanged key column's value comes from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ingest.sources.postgres.pgoutput import UNCHANGED_TOAST, TupleValue
from ingest.sources.postgres.values import Encoder, ValueMappingError, json_str


def json_keys(names: Iterable[str]) -> tuple[str, ...]:
    """Pre-encode column names as JSON object-key prefixes (`'"id":'`) for encode_record/encode_key."""
    return tuple(json_str(n) + ":" for n in names)


def width_error(table: str, width: int, columns: int) -> ValueMappingError:
    """The error of a row whose width is not its relation's (a Relation message was missed)."""
    return ValueMappingError(
        f"table {table}: a row has {width} columns but the relation has {columns}; "
        "a Relation message was missed or applied to the wrong table"
    )


def encode_record(
    table: str,
    keys_json: Sequence[str],
    encoders: Sequence[Encoder],
    names: Sequence[str],
    values: Sequence[TupleValue],
) -> tuple[str, tuple[str, ...] | None]:
    """Encode one row as the compact JSON object text of bronze `record`, in column order.

    The one row encoder of Postgres: the stream (ChangeBuilder, for relations the compiled decoder
    does not take) and the snapshot page reader call it. `keys_json` are the columns' `"name":`
    prefixes (json_keys), `encoders` their value encoders (TypeCatalog.column_encoder), `names`
    their names; `values` the row: text-format bytes, None for NULL (JSON null), UNCHANGED_TOAST
    for a TOASTed value the server did not send (left out of the object). `table` (schema.name)
    only names the table in errors.

    Returns the object and the names of the unchanged-TOAST columns (None if there are none); a key
    column too is left out and listed (encode_key takes its value for `record_pk` from the old tuple).
    Raises ValueMappingError, naming the table, if the row's width is not the relation's (a
    Relation message was missed) or, naming the column too, if a value does not map.
    """
    if len(values) != len(keys_json):
        raise width_error(table, len(values), len(keys_json))
    # An index loop: measured faster than zip() here (CPython 3.11), and this is the hot path.
    parts: list[str] = []
    toast: list[str] | None = None
    i = 0
    try:
        for i, v in enumerate(values):
            if v is None:
                parts.append(keys_json[i] + "null")
            elif v is UNCHANGED_TOAST:
                if toast is None:
                    toast = []
                toast.append(names[i])
            else:
                parts.append(keys_json[i] + encoders[i](v))
    except UnicodeDecodeError as exc:
        raise non_utf8_error(table, f"column {keys_json[i][:-1]}", exc) from exc
    except ValueMappingError as exc:
        raise ValueMappingError(f"table {table}, column {keys_json[i][:-1]}: {exc}") from exc
    return "{" + ",".join(parts) + "}", (tuple(toast) if toast else None)


def non_utf8_error(table: str, column: str, exc: UnicodeDecodeError) -> ValueMappingError:
    """The error of a value that is not UTF-8 under the default `non_utf8: error` (review C6)."""
    return ValueMappingError(
        f"table {table}, {column}: the value is not UTF-8 ({exc}); the database stores bytes in no "
        "encoding (SQL_ASCII). Set the source's `non_utf8` to `replace` or `latin1` to take such values "
        "(docs/postgres.md, Encodings), or fix the row at the source"
    )


def encode_key(
    table: str,
    keys_json: Sequence[str],
    encoders: Sequence[Encoder],
    key_positions: Sequence[int],
    values: Sequence[TupleValue],
    old: Sequence[TupleValue] | None = None,
) -> str:
    """Encode a row's key columns (0-based `key_positions`, in key order) as bronze `record_pk`.

    Gives the canonical compact `{"id":1}`; arguments as for encode_record. The NULL-key rule:
    a NULL key column is JSON null (REPLICA IDENTITY FULL on a table without a primary key makes
    every column part of the key, and those may be NULL).

    The unchanged-TOAST key rule: `old` is an Update's old tuple (`K` or `O`), if it came. A key
    column of `values` sent as UNCHANGED_TOAST ('u': the new value is the old one, not sent) takes
    its value from `old`. The server always sends one then: under REPLICA IDENTITY FULL the old
    row is sent in full with TOASTed values flattened, and under the default identity the old key
    is sent whenever it holds an out-of-line value. Only the key takes it: `record` still leaves
    such a column out and lists it in `unchanged_toast` (encode_record), exactly as a non-key
    unchanged-TOAST column, so `record`/`unchanged_toast` mean the same for every column (bronze
    contract) and the full value stays in `old_record`. With no old value (no old tuple, or NULL
    there: a `K` tuple sends the columns outside the replica identity as NULL) the key cannot be
    known and ValueMappingError names the table and column: writing null would silently give the
    change another row's identity. A row (or `old`) whose width is not the relation's raises as
    in encode_record.
    """
    if len(values) != len(keys_json):
        raise width_error(table, len(values), len(keys_json))
    parts = []
    for i in key_positions:
        v = values[i]
        if v is UNCHANGED_TOAST and old is not None:
            if len(old) != len(keys_json):
                raise width_error(table, len(old), len(keys_json))
            v = old[i]
            if not isinstance(v, bytes):  # NULL (not sent) or unchanged again: no value to take
                v = UNCHANGED_TOAST
        if v is None:
            parts.append(keys_json[i] + "null")
        elif v is UNCHANGED_TOAST:
            raise ValueMappingError(
                f"table {table}: key column {keys_json[i][:-1]} is an unchanged TOAST value (not sent) and the "
                "change carries no old value of it, so the row's key cannot be encoded; the server sends one "
                "when the replica identity is FULL or is the primary key (REPLICA IDENTITY DEFAULT)"
            )
        else:
            try:
                parts.append(keys_json[i] + encoders[i](v))
            except UnicodeDecodeError as exc:
                raise non_utf8_error(table, f"key column {keys_json[i][:-1]}", exc) from exc
            except ValueMappingError as exc:
                raise ValueMappingError(f"table {table}, key column {keys_json[i][:-1]}: {exc}") from exc
    return "{" + ",".join(parts) + "}"
