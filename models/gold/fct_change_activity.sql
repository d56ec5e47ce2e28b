-- One row per source, table, action and hour of commit time: how many change events happened.

with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

final as (

    select
        source,
        table_schema,
        table_name,
        action,
        date_trunc('HOUR', commit_timestamp) as activity_hour,
        count(*) as change_count,
        count(distinct transaction_id) as transaction_count,
        min(seq) as first_seq,
        max(seq) as last_seq
    from sequin_events
    group by
        source,
        table_schema,
        table_name,
        action,
        date_trunc('HOUR', commit_timestamp)

)

select * from final
