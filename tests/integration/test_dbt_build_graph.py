"""Which models `dbt build` holds back for which tests, read from the parsed project (no JVM).

dbt build runs a model only after the tests of what it is built from: a test precedes a model when
every node the test reads is that model's ancestor (dbt's Linker.add_test_edges). A check of the
code on fixed inputs must not hold back the silver chain, and the chain's own tests must.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.helpers.pg import ROOT

DBT = Path(ROOT) / ".venv" / "bin" / "dbt"

# Tests of macros on fixed inputs: their result changes only with the code.
CODE_CHECKS = ("assert_scan_pruning_macros_select_exactly", "assert_event_key_macros_split_events")


def held_back_by(tmp_path: Path) -> dict[str, set[str]]:
    """Per test name, the models dbt build runs only after it."""
    env = dict(
        os.environ,
        DBT_PROFILES_DIR=str(ROOT),
        CHANGELAKE_WAREHOUSE=str(tmp_path / "wh"),
        DBT_TARGET_PATH=str(tmp_path / "target"),
        DBT_LOG_PATH=str(tmp_path / "logs"),
    )
    r = subprocess.run(
        [str(DBT), "parse", "--no-partial-parse", "--project-dir", str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((tmp_path / "target" / "manifest.json").read_text())
    parent_map: dict[str, list[str]] = manifest["parent_map"]

    def ancestors_of(node: str) -> set[str]:
        seen, todo = {node}, [node]
        while todo:
            for parent in parent_map.get(todo.pop(), []):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen

    models = [n for n in manifest["nodes"] if n.startswith("model.")]
    ancestors = {m: ancestors_of(m) for m in models}
    held: dict[str, set[str]] = {}
    for node in manifest["nodes"].values():
        if node["resource_type"] != "test":
            continue
        parents = set(node["depends_on"]["nodes"])
        held[node["name"]] = {
            m.split(".")[-1] for m in models if parents and parents <= ancestors[m] and m not in parents
        }
    return held


def test_code_checks_hold_back_no_model_and_the_chain_tests_do(tmp_path: Path) -> None:
    held = held_back_by(tmp_path)
    for name in CODE_CHECKS:
        assert held[name] == set(), (name, held[name])
    # The invariant tests of sequin_events still hold back what is folded from it.
    folded = {"record_changes", "consumer_records", "record_history"}
    assert folded <= held["assert_sequin_events_are_the_bronze_change_history"]
