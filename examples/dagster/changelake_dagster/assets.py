"""The two assets of a round: bronze (ingest) and what dbt builds on it (silver and gold)."""

# No `from __future__ import annotations`: Dagster reads the context and resource parameters' types
# at definition time.

from typing import Any

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, RetryRequested, asset

from changelake_dagster.round import EXIT_NOTHING_TO_BUILD, EXIT_OK, EXIT_TEMPFAIL, ChangelakeRound, Finished

GROUP = "changelake"


class SourceUnavailable(Exception):
    """ingest exited 75: a source or the warehouse is unavailable; the same round later carries on."""


def _failure(what: str, done: Finished) -> Failure:
    return Failure(
        description=f"{what} exited {done.exit_code}: {done.tail()}",
        metadata={"exit_code": done.exit_code},
    )


def safe_bound_metadata(status: dict[str, Any]) -> dict[str, Any]:
    """Per-source safe bounds of a `status --json` document as asset metadata.

    One text entry per source (`safe_bound/<source>`: the bound as the source prints positions, an
    LSN `X/Y` or a MongoDB `Timestamp(s, i)`; `none` before any writer) and one JSON entry with the
    exact integers: silver is complete below these positions, so a consumer can tell how fresh the
    round's tables are.
    """
    meta: dict[str, Any] = {}
    exact: dict[str, Any] = {}
    for src in status["sources"]:
        meta[f"safe_bound/{src['name']}"] = MetadataValue.text(src["safe_bound_text"] or "none")
        exact[src["name"]] = {
            "safe_bound": src["safe_bound"],
            "safe_bound_text": src["safe_bound_text"],
            "state": src["state"],
            "last_commit_at": src["last_commit_at"],
        }
    meta["safe_bounds"] = MetadataValue.json(exact)
    meta["source_state"] = MetadataValue.text(status["state"])
    return meta


@asset(group_name=GROUP, description="Bronze Delta tables: every source's changes up to its current position.")
def bronze(context: AssetExecutionContext, changelake: ChangelakeRound) -> MaterializeResult[None]:
    """`run --once`; exit 75 asks Dagster to retry later, any other failure fails the step."""
    done = changelake.ingest_once()
    if done.exit_code == EXIT_TEMPFAIL:
        # Nothing was acknowledged past what bronze holds, so a later attempt loses nothing.
        context.log.warning(f"a source or the warehouse is unavailable; retrying later: {done.tail()}")
        raise RetryRequested(
            max_retries=changelake.retries, seconds_to_wait=changelake.retry_wait_seconds
        ) from SourceUnavailable(done.tail())
    if done.exit_code != EXIT_OK:
        raise _failure("changelake-ingest run --once", done)
    return MaterializeResult(metadata=safe_bound_metadata(changelake.status()))


@asset(
    group_name=GROUP,
    deps=[bronze],
    description="Silver and gold, built by dbt from bronze (the dbt half of ops/scheduled_job.sh).",
)
def silver_and_gold(context: AssetExecutionContext, changelake: ChangelakeRound) -> MaterializeResult[None]:
    """The dbt build; a round with nothing new for silver skips dbt and says so in the metadata."""
    done = changelake.build()
    if done.exit_code == EXIT_NOTHING_TO_BUILD:
        context.log.info("ingest committed nothing new for silver since the last dbt build; dbt skipped")
        return MaterializeResult(metadata={"dbt": MetadataValue.text("skipped: nothing new in bronze")})
    if done.exit_code != EXIT_OK:
        raise _failure("the dbt build", done)
    return MaterializeResult(metadata={"dbt": MetadataValue.text("built"), "log_tail": MetadataValue.md(done.tail())})
