"""pgoutput bytes recorded from PostgreSQL 15 (fixtures/pgoutput_v1.json, see record_fixtures.py), for the unit tests.

A helper module, not a test module: the tests of the decoder, the change builder, the value
encoders and the compiled decoder all replay the same recorded steps.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from ingest.sources.postgres.pgoutput import PgOutputMessage, decode
from ingest.sources.postgres.values import TypeCatalog

FIXTURE = Path(__file__).with_name("fixtures") / "pgoutput_v1.json"


@cache
def fixture() -> dict[str, Any]:
    """The recorded steps (see record_fixtures.py)."""
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def raw(step: str, binary: bool = False) -> list[bytes]:
    """The recorded message bytes of one step, in WAL order."""
    [rec] = [s for s in fixture()["steps"] if s["name"] == step]
    return [bytes.fromhex(c["data"]) for c in rec["binary_changes" if binary else "changes"]]


def messages(step: str, binary: bool = False) -> list[PgOutputMessage]:
    """The decoded messages of one step."""
    return [decode(b) for b in raw(step, binary)]


def all_raw() -> list[bytes]:
    """Every recorded message, text and binary mode."""
    out = []
    for rec in fixture()["steps"]:
        for key in ("changes", "binary_changes"):
            out += [bytes.fromhex(c["data"]) for c in rec.get(key, [])]
    return out


class FixtureCatalog:
    """The recorded server's pg_type, and `id` as every table's key (as the recorded tables have)."""

    def __init__(self) -> None:
        self.types = TypeCatalog.from_rows(fixture()["pg_type"])
        self.columns: dict[int, list[str]] = {}

    def record_key(self, relation_id: int) -> list[str]:
        return ["id"] if "id" in self.columns.get(relation_id, []) else []

    def encoder(self, type_oid: int) -> Callable[[bytes], str]:
        return self.types.column_encoder(type_oid)

    def json_kind(self, type_oid: int) -> str:
        return self.types.json_kind(type_oid)

    def type_name(self, type_oid: int, type_modifier: int) -> str:
        return str(type_oid)
