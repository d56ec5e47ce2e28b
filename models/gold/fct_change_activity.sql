{{
    config(
        materialized='incremental',
        incremental_strategy='merge',
        unique_key=['source', 'table_schema', 'table_name', 'action', 'activity_hour'],
        partition_by=['source'],
    )
}}

-- One row per source, table, action and hour of commit time: how many change events happened.
-- Incremental: each run counts the events above the highest seq it has counted per source
-- (sequin_events.seq increases with position and is never reused) and adds them to the stored
-- rows of the same hours. Counts add up across runs: every event of a transaction shares its
-- commit position and commit time, and silver loads a transaction whole, so no transaction is
-- counted in two runs. Full refresh == incremental (DESIGN §7.5).

with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

{% if is_incremental() %}
    counted as (

        select
            source,
            max(last_seq) as max_seq
        from {{ this }}
        group by source

    ),
{% endif %}

new_events as (

    select sequin_events.*
    from sequin_events
    {% if is_incremental() %}
        left join counted
            on sequin_events.source = counted.source
        where sequin_events.seq > coalesce(counted.max_seq, 0)
    {% endif %}

),

new_counts as (

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
    from new_events
    group by
        source,
        table_schema,
        table_name,
        action,
        date_trunc('HOUR', commit_timestamp)

),

{% if is_incremental() %}
    stored_counts as (

        -- The stored rows of the hours this run adds to (table_schema and table_name are never
        -- null: sequin_events holds row changes and truncates, not logical messages).
        select stored.*
        from {{ this }} as stored
        left semi join new_counts
            on
                stored.source = new_counts.source
                and stored.table_schema = new_counts.table_schema
                and stored.table_name = new_counts.table_name
                and stored.action = new_counts.action
                and stored.activity_hour = new_counts.activity_hour

    ),
{% endif %}

all_counts as (

    select * from new_counts
    {% if is_incremental() %}
        union all
        select * from stored_counts
    {% endif %}

),

final as (

    select
        source,
        table_schema,
        table_name,
        action,
        activity_hour,
        sum(change_count) as change_count,
        sum(transaction_count) as transaction_count,
        min(first_seq) as first_seq,
        max(last_seq) as last_seq
    from all_counts
    group by
        source,
        table_schema,
        table_name,
        action,
        activity_hour

)

select * from final
