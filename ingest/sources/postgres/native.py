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

A snapshot page read by COPY is received by the compiled code too (`PageBuilder.read_copy`), with
libpq's own PQgetCopyData and PQfreemem: `copy_functions` finds them in the libpq psycopg loaded.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from psycopg import pq

from ingest.sources.postgres.native_guard import GuardedEncoder, is_panic
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


# PageBuilder.read_copy's status: it handed back refused lines and the COPY goes on, or
# PQgetCopyData's end of the COPY (its result follows) or failure.
COPY_MORE: Final = 0
COPY_END: Final = -1
COPY_FAILED: Final = -2
PROC_MAPS: Final = Path("/proc/self/maps")  # the files mapped into this process: the libpq it loaded
BINARY_LIBS: Final = "psycopg_binary.libs"  # where psycopg's binary wheel keeps its own libpq


@dataclass(frozen=True, slots=True)
class CopyFunctions:
    """The addresses of PQgetCopyData and PQfreemem in the libpq psycopg uses."""

    get_copy_data: int
    freemem: int


_functions: CopyFunctions | None = None
_functions_looked_up = False


def copy_functions() -> CopyFunctions | None:
    """PQgetCopyData and PQfreemem of the libpq psycopg loaded (looked up once), or None (said once at debug).

    They must be that very library's: a PGconn is opaque, so another libpq's functions would read
    the wrong struct. psycopg's ctypes implementation holds its library; the binary and C ones are
    linked to it, so it is the libpq mapped into this process (the binary wheel's own copy, under
    psycopg_binary.libs), opened again without loading anything (RTLD_NOLOAD) and checked by version.
    """
    global _functions, _functions_looked_up
    if not _functions_looked_up:
        _functions_looked_up = True
        try:
            _functions = _lookup_functions()
        except (OSError, AttributeError, ValueError) as e:
            _functions = None
            log.debug("libpq's COPY functions not found (%s): snapshot pages read by COPY are received in Python", e)
    return _functions


def _lookup_functions() -> CopyFunctions:
    lib: Any
    if pq.__impl__ == "python":
        from psycopg.pq import _pq_ctypes

        lib = getattr(_pq_ctypes, "pq")  # noqa: B009 - the loaded CDLL, not in psycopg's stubs
    else:
        lib = ctypes.CDLL(_loaded_libpq(pq.__impl__ == "binary"), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    if lib.PQlibVersion() != pq.version():
        raise ValueError(f"libpq {lib.PQlibVersion()} is not the {pq.version()} psycopg uses")
    get, free = (ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in ("PQgetCopyData", "PQfreemem"))
    if not get or not free:
        raise ValueError("PQgetCopyData or PQfreemem has no address")
    return CopyFunctions(get, free)


def _loaded_libpq(binary: bool) -> str:
    """The path of the one libpq mapped into this process: the binary wheel's own, or else the system's."""
    paths = {
        line.split(maxsplit=5)[5]
        for line in PROC_MAPS.read_text().splitlines()
        if line.count(" ") >= 5 and Path(line.split(maxsplit=5)[-1]).name.startswith("libpq")
    }
    paths = {p for p in paths if (Path(p).parent.name == BINARY_LIBS) == binary}
    if len(paths) != 1:
        raise ValueError(f"{len(paths)} libpq libraries loaded, not one: {sorted(paths)}")
    return paths.pop()


_panic_warned: set[str] = set()


def read_copy(
    page: Any,
    conn: pq.abc.PGconn,
    functions: CopyFunctions,
    max_chars: int,
    cut: bool,
    chunk: tuple[int, int],
    what: str,
) -> tuple[int, bool, bytes | None]:
    """PageBuilder.read_copy on `conn`'s COPY: (status, cut, refused lines or None); see native/src/lib.rs.

    `chunk`: at most this many (lines, bytes) handed back refused at once. A line the compiled
    encoder panicked on comes back refused, and one warning per relation (`what`) names it. A
    panic outside the encoding, or a connection already closed, raises ValueError.
    """
    ptr = getattr(conn, "pgconn_ptr", None)  # the C PGconn*, which psycopg's protocol class leaves out
    if ptr is None:
        raise ValueError("the connection is closed")
    try:
        status, cut, refused, panic = page.read_copy(
            ptr, functions.get_copy_data, functions.freemem, max_chars, cut, *chunk
        )
    except ValueError:
        raise
    except BaseException as e:
        if not is_panic(e):
            raise
        raise ValueError(f"compiled decoder panicked on {what}: {' '.join(str(e).split())}") from None
    if panic is not None and what not in _panic_warned:
        _panic_warned.add(what)
        log.warning(
            "the compiled decoder panicked on %s (%s): a bug in native/, please report it; the rows it fails "
            "on are encoded in Python (same output, slower)",
            what,
            " ".join(panic.split()),
        )
    return status, cut, refused
