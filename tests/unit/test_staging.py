"""Stale staging directories (left by a killed ingest) are removed; fresh ones, in use, are kept."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ingest.bronze.writer import remove_stale_staging


def test_only_directories_older_than_the_cutoff_are_removed(tmp_path: Path) -> None:
    staging = tmp_path / "_staging"
    old, fresh = staging / "wal_events-old", staging / "wal_events-fresh"
    for d in (old, fresh):
        d.mkdir(parents=True)
        (d / "part-00000.parquet").write_bytes(b"PAR1")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert remove_stale_staging(staging, older_than_s=3600) == 1
    assert not old.exists()
    assert (fresh / "part-00000.parquet").exists()


def test_a_missing_staging_directory_is_nothing_to_do(tmp_path: Path) -> None:
    assert remove_stale_staging(tmp_path / "absent") == 0
