"""Ingest with an object-store warehouse: bronze on S3 (a local moto server), the same contract as a path.

moto's server mode speaks the S3 API on loopback, including the conditional put (`If-None-Match`)
delta-rs commits with. Credentials come from the environment as they would in production; the
endpoint comes from the config's `storage_options`. dbt/Spark against S3 is not run here (Spark
would need hadoop-aws and the AWS SDK bundle, ~600 MB): README and docs/cluster.md say so.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ingest.bronze.writer import BronzeWriter
from tests.helpers.pg import ROOT, prepare

pytestmark = pytest.mark.integration

BUCKET = "changelake-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, with an empty bucket; stopped at teardown."""
    import boto3

    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "moto_server exited"
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.2)
        boto3.client("s3", endpoint_url=endpoint, **_boto_credentials()).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "region_name": CREDENTIALS["AWS_REGION"],
    }


def test_ingest_writes_bronze_to_s3_exactly_once(s3_endpoint: str, tmp_path: Path, make_source: Any) -> None:
    s = make_source("create table items (id int primary key, v text)", ["items"])
    s.execute("insert into items select g, 'before' from generate_series(1, 30) g")
    prepare(s.config())
    s.execute("insert into items select g, 'stream' from generate_series(31, 50) g")
    s.execute("update items set v = 'changed' where id <= 5")
    s.execute("delete from items where id between 6 and 8")
    warehouse = f"s3://{BUCKET}/warehouse"
    storage = {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ALLOW_HTTP": "true"}
    cfg = tmp_path / "ingest.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "warehouse": warehouse,
                "storage_options": storage,
                "sources": [{"kind": "postgres", "name": s.name, "dsn": s.dsn, "tables": s.tables}],
            }
        )
    )
    env = dict(os.environ, **CREDENTIALS)

    def ingest(*args: str) -> str:
        r = subprocess.run(
            [sys.executable, "-m", "ingest", "-c", str(cfg), *args], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout

    ingest("run", "--once")
    s.execute("insert into items values (51, 'second run')")
    ingest("run", "--once")
    status = ingest("status")
    assert "writer stream (stream): durable" in status and "safe bound" in status, status

    os.environ.update(CREDENTIALS)  # delta-rs in this process reads them from the environment too
    try:
        writer = BronzeWriter(warehouse, storage)
        events = writer.tables.query(
            "select action, record_pk, commit_lsn, commit_index from t "
            f"where source = '{s.name}' and action != 'message' order by commit_lsn, commit_index",
            t=f"{warehouse}/bronze/wal_events",
        ).to_pylist()
        pages = writer.tables.query(
            f"select record_pk from t where source = '{s.name}' and record_pk is not null",
            t=f"{warehouse}/bronze/snapshot_pages",
        ).to_pylist()
        positions = writer.positions(s.name)
    finally:
        for k in CREDENTIALS:
            os.environ.pop(k, None)
    keys = [(e["commit_lsn"], e["commit_index"]) for e in events]
    assert len(keys) == len(set(keys)), "an event twice in bronze"
    assert [e["action"] for e in events] == ["insert"] * 20 + ["update"] * 5 + ["delete"] * 3 + ["insert"]
    # the initial snapshot read the table as the first run found it
    assert sorted(json.loads(p["record_pk"])["id"] for p in pages) == [*range(1, 6), *range(9, 51)]
    assert [p.writer_id for p, _ in positions] == ["stream"]  # the snapshot writer retired
    assert positions[0][0].durable_lsn >= keys[-1][0]
