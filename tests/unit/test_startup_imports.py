"""A Postgres `run` loads only what it uses: no MongoDB driver, no pandas, no gold or verify code.

Each of these cost its start-up time for nothing: pymongo (0.1 s) came with the retry rules,
pandas (0.25-0.3 s) with every bronze read (`pa.table()` of a query result asks whether it is a
DataFrame), and the start is part of every `run --once` (bench/ingest_throughput.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

ROOT = Path(__file__).resolve().parents[2]
NOT_FOR_POSTGRES = ("pymongo", "bson", "pandas", "ingest.gold", "ingest.verify", "ingest.sources.mongodb")


def loaded_after(code: str) -> list[str]:
    """The modules of NOT_FOR_POSTGRES a fresh interpreter has loaded after running `code`."""
    listed = f"sorted(m for m in sys.modules if m.startswith({NOT_FOR_POSTGRES!r}))"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({listed}))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_the_postgres_run_path_imports_no_other_source_or_command() -> None:
    code = (
        "import ingest.cli, ingest.app\n"
        "from ingest.sources.postgres import adapter, capture\n"
        "from ingest.capture.retry import is_transient\n"
        "assert is_transient(ConnectionResetError()) is False"
    )
    assert loaded_after(code) == []


def test_a_bronze_read_does_not_import_pandas(tmp_path: Path) -> None:
    """Regression: the first bronze query of a process imported pandas (0.3 s of every start)."""
    write_deltalake(str(tmp_path / "t"), pa.table({"a": [1, 2]}))
    code = (
        "from ingest.bronze.delta import DeltaTables\n"
        f"t = DeltaTables().query('select sum(a) as s from t', t={str(tmp_path / 't')!r})\n"
        "assert t.to_pylist() == [{'s': 3}], t"
    )
    assert loaded_after(code) == []


def test_the_process_entry_point_freezes_the_collector_before_teardown() -> None:
    """The interpreter's teardown collected the imports' objects again and again: 0.3-0.5 s a command.

    Only the process's own entry point (no argv) freezes them; a caller passing argv (the tests)
    keeps a working collector.
    """
    code = (
        "import gc, sys\n"
        "from ingest.cli import main\n"
        "assert main(['config', 'schema']) == 0 and gc.get_freeze_count() == 0\n"
        "sys.argv = ['changelake-ingest', 'config', 'schema']\n"
        "assert main() == 0\n"
        "print(gc.get_freeze_count())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) > 0
