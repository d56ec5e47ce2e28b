"""A run that leaves one incremental silver model out must not mark the batch loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.pg import capture_once, prepare
from tests.helpers.silver import dbt, silver

pytestmark = pytest.mark.integration


def test_a_run_without_record_history_leaves_nothing_marked_loaded(warehouse: Path, make_source: Any) -> None:
    """`dbt run --exclude record_history` loaded a batch into the other incremental models and
    recorded its bound in loaded_bounds (which listed three loaders of four). Every later run then
    found nothing new past that bound for record_history and skipped it (skip_when='nothing_new'):
    the batch never reached the history. With nothing marked loaded, the next full run loads it.
    """
    s = make_source("create table items (id int primary key, n int)", ["items"])
    prepare(s.config())
    s.execute("insert into items select g, 0 from generate_series(1, 5) g")
    s.execute("update items set n = 1 where id <= 3")
    capture_once(warehouse, s.config(snapshot={"initial": False}))
    dbt(warehouse, "run", "--select", "silver", "--exclude", "record_history")
    assert silver(warehouse, "loaded_bounds") == []  # nothing known loaded: the next run loads
    live = {r.record_pk: json.loads(r.record)["n"] for r in silver(warehouse, "consumer_records") if not r.deleted}
    assert live == {'{"id":1}': 1, '{"id":2}': 1, '{"id":3}': 1, '{"id":4}': 0, '{"id":5}': 0}
