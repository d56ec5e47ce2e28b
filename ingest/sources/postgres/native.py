"""The compiled row decoder (native/, Rust): Insert/Update/Delete -> JSON texts, for scalar relations.

`changelake_pgoutput.RowEncoder` does for one relation what `pgoutput.decode` + `values.encode_record`
/ `encode_key` + the value encoders do, byte for byte (tests/unit/sources/postgres/test_native.py
compares them on random rows): the decoder's per-change Python work was the measured bottleneck of
`run --once` (BENCHMARKS.md). It covers the JSON kinds that map a value by itself (int, float,
bool, and every kind written as a JSON string); a relation with an array column keeps the Python
path. A message it does not handle the same way (malformed, a value that does not map, a row whose
width is not the relation's, an unchanged-TOAST key column the old tuple does not carry) is refused
with ValueError and decoded by Python, which raises the error a user sees.

`make setup` builds and installs it (`pip install ./native`); without it ingest runs the pure
Python path (same output, about half the speed) and says so once in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from ingest.sources.postgres.native_guard import GuardedEncoder
from ingest.sources.postgres.values import Encoder, _bytes_bool, _bytes_float, _bytes_int, _bytes_str

log = logging.getLogger(__name__)

try:
    from changelake_pgoutput import RowEncoder as _RowEncoder
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _RowEncoder = None

# The Python encoders the compiled one reproduces, with the codes native/src/lib.rs takes. A column
# with any other encoder (arrays) keeps its relation on the Python path.
_NATIVE_CODE: Final[dict[Encoder, int]] = {_bytes_int: 0, _bytes_float: 1, _bytes_bool: 2, _bytes_str: 3}
_warned = False


def available() -> bool:
    """Whether the compiled decoder is installed."""
    return _RowEncoder is not None


def row_encoder(
    encoders: Sequence[Encoder],
    keys_json: Sequence[str],
    names: Sequence[str],
    pk_idx: Sequence[int],
    table: str | None = None,
) -> Any:
    """A RowEncoder for a relation whose columns use these Python encoders, or None (Python path).

    `keys_json` are the pre-encoded `"name":` prefixes, `pk_idx` the key columns' positions. A panic
    of it is a refusal naming `table` (native_guard.py).
    """
    global _warned
    if _RowEncoder is None:
        if not _warned:
            log.warning("compiled pgoutput decoder not installed (make setup builds native/): decoding in Python")
            _warned = True
        return None
    codes = [_NATIVE_CODE.get(e) for e in encoders]
    if None in codes:
        return None
    what = table or f"the relation of columns {', '.join(names)}"
    return GuardedEncoder(_RowEncoder(codes, list(keys_json), list(names), list(pk_idx)), what)
