"""A Dagster asset graph for changelake: `run --once` into bronze, then the dbt build on top."""

from changelake_dagster.assets import bronze, silver_and_gold
from changelake_dagster.definitions import defs
from changelake_dagster.round import ChangelakeRound

__all__ = ["ChangelakeRound", "bronze", "defs", "silver_and_gold"]
