{{
    config(
        materialized='changelake_incremental',
        incremental_strategy='merge',
        unique_key=['source', 'table_schema', 'table_name', 'action', 'activity_hour'],
        partition_by=['source'],
        skip_when='inputs_unchanged',
        on_schema_change='append_new_columns',
    )
}}

-- One row per source, table, action and hour of commit time: how many change events happened.
-- Incremental: each run counts the events above the highest seq it has counted per source
-- (sequin_events.seq increases with position and is never reused) and adds them to the stored
-- rows of the same hours. Counts add up across runs: every event of a transaction shares its
-- commit position and commit time, and silver loads a transaction whole, so no transaction is
-- counted in two runs. Full refresh == incremental (DESIGN §7.5). A run whose input
-- (sequin_events) is at the Delta version the last run counted is skipped (skip_when), so a
-- scheduled build with nothing new starts no Spark job here, and one after a `dbt run --select
-- silver` still counts what that run loaded.

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
        max(seq) as last_seq,
        max_by(commit_lsn, seq) as last_commit_lsn,
        max_by(commit_timestamp, seq) as last_event_at
    from new_events
    group by
        source,
        table_schema,
        table_name,
        action,
        date_trunc('HOUR', commit_timestamp)

),

{% if is_incremental() %}
    {#- A table counted before last_commit_lsn and last_event_at existed gets them (nulls) from
        on_schema_change; until then its rows give nulls here. -#}
    {%- set stored_columns = adapter.get_columns_in_relation(this) | map(attribute='name') | list %}
    stored_counts as (

        -- The stored rows of the hours this run adds to (table_schema and table_name are never
        -- null: sequin_events holds row changes and truncates, not logical messages).
        select
            stored.source,
            stored.table_schema,
            stored.table_name,
            stored.action,
            stored.activity_hour,
            stored.change_count,
            stored.transaction_count,
            stored.first_seq,
            stored.last_seq,
            {{ 'stored.last_commit_lsn' if 'last_commit_lsn' in stored_columns
                else 'cast(null as bigint)' }} as last_commit_lsn,
            {{ 'stored.last_event_at' if 'last_event_at' in stored_columns
                else 'cast(null as timestamp)' }} as last_event_at
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
        max(last_seq) as last_seq,
        max_by(last_commit_lsn, last_seq) as last_commit_lsn,
        max_by(last_event_at, last_seq) as last_event_at
    from all_counts
    group by
        source,
        table_schema,
        table_name,
        action,
        activity_hour

)

select * from final
