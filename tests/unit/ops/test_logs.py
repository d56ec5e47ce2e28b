"""JSON and text logs carry the same facts and never a secret (docs/operations.md, Logs)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.config import parse_config
from ingest.ops.logs import JsonFormatter, TextFormatter, configure, redact, secrets_of

ROOT = Path(__file__).resolve().parents[3]
PASSWORD = "Pa55-w0rd-xyz"


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError(f"connect to postgresql://app:{PASSWORD}@db/x failed")
        except RuntimeError:
            exc_info = sys.exc_info()
    return logging.LogRecord("ingest.ops.watch", logging.WARNING, __file__, 1, msg, args, exc_info)


def test_json_lines_lift_the_key_value_fields_of_the_text_log() -> None:
    r = record("alert source=%s alert=%s lag=%d ratio=%.1f note=%s", "shop", "slot_lag", 5, 0.5, "'a b'")
    doc = json.loads(JsonFormatter().format(r))
    assert doc["level"] == "WARNING" and doc["logger"] == "ingest.ops.watch" and doc["ts"].endswith("Z")
    assert doc["message"] == "alert source=shop alert=slot_lag lag=5 ratio=0.5 note='a b'"
    assert (doc["source"], doc["alert"], doc["lag"], doc["ratio"], doc["note"]) == ("shop", "slot_lag", 5, 0.5, "a b")
    clash = json.loads(JsonFormatter().format(record("x level=%s", "mine")))
    assert clash["level"] == "WARNING" and clash["field_level"] == "mine"  # a field never overwrites the envelope


@pytest.mark.parametrize("formatter", [JsonFormatter(["lit3ral-secret"]), TextFormatter(["lit3ral-secret"])])
def test_passwords_and_config_secrets_are_masked_in_both_formats(formatter: logging.Formatter) -> None:
    msg = "dsn=%s kv=%s hook=%s"
    line = formatter.format(
        record(msg, f"postgresql://app:{PASSWORD}@db:5432/x", f"host=db password={PASSWORD} user=app", "lit3ral-secret")
    )
    line += formatter.format(record("quoted password='%s' user=app", PASSWORD, exc=True))
    assert PASSWORD not in line and "lit3ral-secret" not in line
    assert "postgresql://app:***@db:5432/x" in line and "user=app" in line


def test_the_config_names_its_secrets() -> None:
    cfg = parse_config(
        "sources:\n"
        f"  - {{kind: postgres, name: a, dsn: 'host=h password={PASSWORD}', tables: [s.t]}}\n"
        "  - {kind: postgres, name: b, dsn: 'postgresql://u:p%40ss@h/d', tables: [s.t]}\n"
        "  - {kind: mongodb, name: m, uri: 'mongodb://u:m0ngo-pw@h/', database: d}\n"
        "alerts: {webhook: {url: 'https://hooks.example/T/B/tok'}}\n"
    )
    assert set(secrets_of(cfg)) == {PASSWORD, "p%40ss", "p@ss", "m0ngo-pw", "https://hooks.example/T/B/tok"}
    with pytest.raises(Exception, match=r"log\.format"):
        parse_config("sources: [{kind: postgres, name: s, dsn: 'host=x', tables: [a.b]}]\nlog: {format: xml}\n")


def test_the_cli_error_line_is_masked_with_the_configured_secrets() -> None:
    """The one-line verdict on stderr is printed, not logged: it is masked by the same rules."""
    configure(logging.WARNING, "text", ["s3cr3t-hook"])
    try:
        assert redact("post to https://h/s3cr3t-hook failed; dsn password=pw1 host=h") == (
            "post to https://h/*** failed; dsn password=*** host=h"
        )
    finally:
        configure(logging.WARNING, "text")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(tmp_path: Path, log_key: str, *flags: str) -> tuple[int, list[str]]:
    cfg = tmp_path / "ingest.yml"
    dsn = f"postgresql://changelake:{PASSWORD}@127.0.0.1:{closed_port()}/changelake?connect_timeout=2"
    cfg.write_text(
        f"warehouse: {tmp_path / 'wh'}\nretry: {{max_seconds: 1, max_delay_seconds: 0.2}}\n{log_key}"
        f"sources: [{{kind: postgres, name: down, dsn: '{dsn}', tables: [public.t]}}]\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "ingest", "-c", str(cfg), "-v", *flags, "run", "--once"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert PASSWORD not in p.stdout + p.stderr
    return p.returncode, p.stderr.splitlines()


def test_a_failing_connection_logs_json_lines_without_the_password(tmp_path: Path) -> None:
    code, lines = run_cli(tmp_path, "log: {format: json}\n")  # the config key alone
    assert code == 75, lines
    *logged, last = lines
    assert last.startswith("changelake-ingest: source unavailable:")  # the command's one-line verdict stays text
    docs = [json.loads(line) for line in logged]
    assert docs and all({"ts", "level", "logger", "message"} <= d.keys() for d in docs)
    retries = [d for d in docs if d.get("attempt") is not None]
    assert retries and all(d["source"] == "down" and d["level"] == "WARNING" for d in retries), docs

    code, lines = run_cli(tmp_path, "log: {format: json}\n", "--log-format", "text")  # the flag wins
    assert code == 75 and any("level=WARNING" in line and "source=down" in line for line in lines), lines
