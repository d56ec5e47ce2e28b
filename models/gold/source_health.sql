-- One row per source: its safe bound, how far silver lags behind what ingest has observed, recent
-- activity and snapshot progress, as of this run.

with

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

stream_positions as (

    select * from {{ source('bronze', 'stream_positions') }}

),

snapshot_pages as (

    select * from {{ source('bronze', 'snapshot_pages') }}

),

running_snapshots as (

    -- A snapshot writer's resume_token carries its progress (docs/snapshots.md).
    select
        source,
        count(*) as snapshots_running,
        sum(cast(get_json_object(resume_token, '$.rows') as bigint)) as snapshot_rows_read,
        sum(cast(get_json_object(resume_token, '$.estimated_rows') as bigint)) as snapshot_rows_estimated
    from stream_positions
    where writer_kind = 'snapshot'
    group by source

),

completed_snapshots as (

    select
        source,
        count(distinct snapshot_id) as snapshots_completed
    from snapshot_pages
    where last_page
    group by source

),

event_activity as (

    select
        source,
        max(seq) as last_seq,
        max_by(commit_lsn, seq) as last_commit_lsn,
        max_by(commit_timestamp, seq) as last_event_at,
        count_if(commit_timestamp >= current_timestamp() - interval 1 hour) as events_last_hour
    from sequin_events
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
        coalesce(event_activity.events_last_hour, 0) as events_last_hour,
        safe_bounds.writer_count,
        safe_bounds.positions_updated_at,
        coalesce(running_snapshots.snapshots_running, 0) as snapshots_running,
        coalesce(running_snapshots.snapshot_rows_read, 0) as snapshot_rows_read,
        running_snapshots.snapshot_rows_estimated,
        coalesce(completed_snapshots.snapshots_completed, 0) as snapshots_completed,
        current_timestamp() as measured_at
    from safe_bounds
    left join event_activity
        on safe_bounds.source = event_activity.source
    left join running_snapshots
        on safe_bounds.source = running_snapshots.source
    left join completed_snapshots
        on safe_bounds.source = completed_snapshots.source

)

select * from final
