"""The Dagster code location: the round's assets, a job, a five-minute schedule and the resource wiring."""

from __future__ import annotations

from pathlib import Path

from dagster import AssetSelection, Definitions, EnvVar, ScheduleDefinition, define_asset_job

from changelake_dagster.assets import GROUP, bronze, silver_and_gold
from changelake_dagster.round import ChangelakeRound

# examples/dagster/changelake_dagster/ -> the checkout
PROJECT_DIR = Path(__file__).resolve().parents[3]

changelake_round = define_asset_job("changelake_round", selection=AssetSelection.groups(GROUP))

defs = Definitions(
    assets=[bronze, silver_and_gold],
    jobs=[changelake_round],
    # Every five minutes, as ops/systemd/changelake-build.timer. A slot takes one reader at a time:
    # limit the job to one run at a time in the instance's run queue (docs/operations.md).
    schedules=[ScheduleDefinition(job=changelake_round, cron_schedule="*/5 * * * *")],
    resources={
        "changelake": ChangelakeRound(
            project_dir=str(PROJECT_DIR),
            config=EnvVar("CHANGELAKE_CONFIG"),
            warehouse=EnvVar("CHANGELAKE_WAREHOUSE"),
        )
    },
)
