"""`changelake-ingest verify` on a warehouse that fails on I/O says "try again later" (exit 75), in one line.

Real PostgreSQL, ingest running (as verify needs), silver as dbt would fold the initial snapshot
(tests/integration/test_verify_edges.py), then made unreadable the way tests/unit/bronze/
test_delta_io_retry.py does it: a data file replaced by a folder, which even root cannot read. The
backoff is lowered through delta.py's constants; nothing is mocked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest import cli
from ingest.bronze import delta
from ingest.bronze.schemas import VERIFICATION_RUNS_TABLE
from ingest.bronze.writer import BronzeWriter
from ingest.verify import silver_path
from tests.helpers.pg import capture_once, prepare
from tests.integration.test_verify_edges import Ingesting, fold_snapshot

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("what", ["silver", "verification_runs"])
def test_verify_on_a_warehouse_failing_on_io_exits_75_in_one_line(
    tmp_path: Path,
    warehouse: Path,
    make_source: Any,
    what: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Silver's data file unreadable: verify exited 1 "internal error ... please report it" (its reads were
    neither retried nor mapped); verification_runs' append failing on I/O: exit 2 (record_run rewrapped
    the BronzeUnavailableError into a plain BronzeWriteError).
    """
    monkeypatch.setattr(delta, "IO_BACKOFF_S", 0.0)
    s = make_source("create table docs (id int primary key, v text)", ["docs"])
    (docs,) = s.tables
    s.execute(f"insert into {docs} select g, 'v' || g from generate_series(1, 20) g")
    src = s.config()
    prepare(src)
    capture_once(warehouse, src, snapshots=True)
    fold_snapshot(warehouse, s.name)
    writer = BronzeWriter(warehouse)
    if what == "silver":
        broken = silver_path(writer)
        for data in Path(broken).glob("*.parquet"):
            data.unlink()
            data.mkdir()
    else:
        t = VERIFICATION_RUNS_TABLE
        broken = writer.path(t)
        writer.tables.create(broken, t.schema, t.partition_by, dict(t.properties))
        (Path(broken) / f"source={s.name}").write_text("a file where the partition's folder goes")
    source = {"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}
    config = tmp_path / "ingest.yml"
    config.write_text(yaml.safe_dump({"warehouse": str(warehouse), "sources": [source]}))

    capsys.readouterr()
    with Ingesting(warehouse, src):
        code = cli.main(["-c", str(config), "verify", "--wait", "30", "--no-progress"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_TEMPFAIL, err
    assert err.count("\n") == 1 and "Traceback" not in err and "\x1b" not in err, err
    assert err.startswith("changelake-ingest: warehouse unavailable: "), err
    assert broken in err, err
