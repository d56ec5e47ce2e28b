{{ config(materialized='view') }}

-- One row per source: its safe bound, how far silver lags behind what ingest has observed, recent
-- activity, snapshot progress and the latest verification of each of its tables. A view: the
-- time-relative columns (lag_seconds, events_last_hour, measured_at) are those of the moment it is
-- read, and a run builds nothing for it. Every input is small (a row per source, per snapshot, per
-- verified table, per hour of activity) but for the last hour of sequin_events, which Delta's file
-- statistics prune to.

with

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

change_activity as (

    select * from {{ ref('fct_change_activity') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

snapshot_progress as (

    select * from {{ ref('snapshot_progress') }}

),

verification_runs as (

    select * from {{ ref('verification_runs') }}

),

verification_activity as (

    -- The latest verification of each table of the source.
    select
        source,
        max(finished_at) as last_verified_at,
        count_if(status = 'equal') as tables_verified_equal,
        count_if(status = 'mismatch') as tables_mismatched,
        count_if(status = 'not_verified') as tables_not_verified,
        sum(mismatches) as verification_mismatches
    from verification_runs
    where is_latest
    group by source

),

snapshot_activity as (

    select
        source,
        count_if(is_running) as snapshots_running,
        sum(case when is_running then rows_read end) as snapshot_rows_read,
        sum(case when is_running then estimated_rows end) as snapshot_rows_estimated,
        count_if(is_completed) as snapshots_completed
    from snapshot_progress
    group by source

),

event_activity as (

    -- The last event from the hourly counts (small: they grow with hours, not with events).
    select
        source,
        max(last_seq) as last_seq,
        max_by(last_commit_lsn, last_seq) as last_commit_lsn,
        max_by(last_event_at, last_seq) as last_event_at
    from change_activity
    group by source

),

recent_events as (

    -- current_timestamp() is one constant per query, so Delta's file statistics on
    -- commit_timestamp skip every file of older events: this reads the last hour's files, not
    -- the whole history.
    select
        source,
        count(*) as events_last_hour
    from sequin_events
    where commit_timestamp >= current_timestamp() - interval 1 hour
    group by source

),

final as (

    select
        safe_bounds.source,
        safe_bounds.safe_lsn,
        safe_bounds.max_observed_lsn,
        safe_bounds.max_observed_lsn - safe_bounds.safe_lsn as lag_bytes,
        event_activity.last_seq,
        event_activity.last_commit_lsn,
        event_activity.last_event_at,
        cast(
            unix_timestamp(current_timestamp()) - unix_timestamp(event_activity.last_event_at) as bigint
        ) as lag_seconds,
        coalesce(recent_events.events_last_hour, 0) as events_last_hour,
        safe_bounds.writer_count,
        safe_bounds.positions_updated_at,
        coalesce(snapshot_activity.snapshots_running, 0) as snapshots_running,
        coalesce(snapshot_activity.snapshot_rows_read, 0) as snapshot_rows_read,
        snapshot_activity.snapshot_rows_estimated,
        coalesce(snapshot_activity.snapshots_completed, 0) as snapshots_completed,
        verification_activity.last_verified_at,
        coalesce(verification_activity.tables_verified_equal, 0) as tables_verified_equal,
        coalesce(verification_activity.tables_mismatched, 0) as tables_mismatched,
        coalesce(verification_activity.tables_not_verified, 0) as tables_not_verified,
        coalesce(verification_activity.verification_mismatches, 0) as verification_mismatches,
        current_timestamp() as measured_at
    from safe_bounds
    left join event_activity
        on safe_bounds.source = event_activity.source
    left join recent_events
        on safe_bounds.source = recent_events.source
    left join snapshot_activity
        on safe_bounds.source = snapshot_activity.source
    left join verification_activity
        on safe_bounds.source = verification_activity.source

)

select * from final
