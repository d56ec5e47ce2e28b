"""Read Delta tables in tests without a JVM: delta-rs's query engine, rows with attribute access.

Deletion vectors (silver's tables have them) are honoured by delta-rs's DataFusion reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder


class Row(dict[str, Any]):
    """One row: `r.col` and `r["col"]`; nested structs are Rows too."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def asDict(self, recursive: bool = False) -> dict[str, Any]:  # noqa: N802 - pyspark's Row API
        return _plain(self)


def _wrap(v: Any) -> Any:
    if isinstance(v, dict):
        return Row({k: _wrap(x) for k, x in v.items()})
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def read(path: Path | str, where: str | None = None, order_by: str | None = None) -> list[Row]:
    """The rows of the Delta table at `path` (SQL `where` and `order by` text, optional)."""
    sql = "select * from t" + (f" where {where}" if where else "") + (f" order by {order_by}" if order_by else "")
    table = pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute(sql).read_all())
    return [_wrap(r) for r in table.to_pylist()]


def exists(path: Path | str) -> bool:
    """Whether a Delta table is at `path`."""
    return bool(DeltaTable.is_deltatable(str(path)))
