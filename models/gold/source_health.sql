-- One row per source: its safe bound, how far silver lags behind what ingest has observed, and
-- recent activity, as of this run.

with

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

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
        current_timestamp() as measured_at
    from safe_bounds
    left join event_activity
        on safe_bounds.source = event_activity.source

)

select * from final
