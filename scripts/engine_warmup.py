"""Warm a freshly started Spark Thrift server before dbt's first build on it.

A new JVM interprets Spark's planner, Delta's log replay and commit path, the metastore client and
the code generator until the JIT compiles them: the first `dbt build` on a fresh engine ran its
first nodes 3-10x slower than the same nodes on a warm one (docs/dbt.md, "A warm engine"). This
script runs the statement shapes a changelake build runs (path-based Delta reads with position
filters, CREATE OR REPLACE ... AS SELECT into the metastore, MERGE with deletes, window functions,
table properties, `describe history`, `show table extended`) on scratch tables of its own, a few
times, then drops them. It reads and writes nothing of the warehouse's own tables.

Usage: python scripts/engine_warmup.py HOST PORT SCRATCH_DIR [ROUNDS]
Exit 0 when warm, 1 (with the server's message) when a statement failed.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from pyhive import hive

SCHEMA = "changelake_engine_warmup"


def statements(scratch: str, round_no: int) -> list[str]:
    """One round's statements on the scratch tables; each round writes a new range of positions."""
    low, high = round_no * 20000, (round_no + 1) * 20000
    events = f"delta.`{scratch}/events`"
    state = f"{SCHEMA}.state"
    return [
        f"create schema if not exists {SCHEMA} location '{scratch}/schema'",
        f"show table extended in {SCHEMA} like '*'",
        f"create or replace table {events} using delta as "
        "select cast(id % 97 as string) as source, id as commit_lsn, cast(id % 7 as int) as commit_index, "
        "case when id % 11 = 0 then 'delete' when id % 3 = 0 then 'update' else 'insert' end as action, "
        "cast(id % 5000 as string) as record_pk, to_json(named_struct('id', id, 'v', uuid())) as record, "
        f"timestamp_millis(1700000000000 + id) as committed_at from range({low}, {high})",
        f"create or replace table {state} using delta as "
        "select source, record_pk, commit_lsn, commit_index, record, action = 'delete' as deleted "
        f"from {events} where commit_lsn < {low + 5000}",
        f"show tblproperties {state}",
        f"alter table {state} set tblproperties ('changelake.warmup' = '{round_no}')",
        f"describe history {state}",
        f"merge into {state} as t using ("
        "  select * from ("
        "    select *, row_number() over ("
        "      partition by source, record_pk order by commit_lsn desc, commit_index desc) as rn"
        f"    from {events} where commit_lsn >= {low + 5000} and commit_lsn < {high}"
        "  ) where rn = 1"
        ") as s on t.source = s.source and t.record_pk = s.record_pk "
        "when matched and s.action = 'delete' then update set t.deleted = true, t.commit_lsn = s.commit_lsn "
        "when matched then update set t.record = s.record, t.commit_lsn = s.commit_lsn, t.deleted = false "
        "when not matched then insert (source, record_pk, commit_lsn, commit_index, record, deleted) "
        "values (s.source, s.record_pk, s.commit_lsn, s.commit_index, s.record, s.action = 'delete')",
        f"insert into {state} select source, record_pk, commit_lsn, commit_index, record, false "
        f"from {events} where commit_lsn = {low}",
        "select source, count(*) as n, count_if(deleted) as d, max(commit_lsn) as m, "
        "max(get_json_object(record, '$.id')) as j "
        f"from {state} where commit_lsn > 10 group by source order by source limit 5",
        f"select a.source, count(*) from {events} a left anti join {state} b "
        "on a.source = b.source and a.record_pk = b.record_pk group by a.source",
        f"select count(*) from (select source, commit_lsn, commit_index, count(*) c from {events} "
        "group by source, commit_lsn, commit_index having count(*) > 1)",
    ]


def main(argv: list[str]) -> int:
    """The command line (module docstring); returns the exit code."""
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    host, port, scratch_dir = argv[1], int(argv[2]), Path(argv[3]).resolve()
    rounds = int(argv[4]) if len(argv) == 5 else 3
    shutil.rmtree(scratch_dir, ignore_errors=True)
    scratch_dir.mkdir(parents=True)
    started = time.monotonic()
    conn = hive.connect(host=host, port=port, username="changelake")
    cursor = conn.cursor()
    try:
        for round_no in range(rounds):
            for sql in statements(str(scratch_dir), round_no):
                cursor.execute(sql)
                if cursor.description:
                    cursor.fetchall()
        cursor.execute(f"drop schema if exists {SCHEMA} cascade")
    except Exception as exc:  # the server's message is what an operator needs
        print(f"engine warm-up failed: {exc}", file=sys.stderr)
        return 1
    finally:
        conn.close()
        shutil.rmtree(scratch_dir, ignore_errors=True)
    print(f"engine warmed in {time.monotonic() - started:.1f} s ({rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
