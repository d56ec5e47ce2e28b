{{
    config(
        materialized='changelake_incremental',
        incremental_strategy='append',
        skip_when='inputs_unchanged',
        report_completeness=true,
    )
}}

-- One row per source per dbt run that built it: silver is complete through the source's loaded
-- safe bound (every change committed at or below it is in silver, none above it is), with the commit
-- time of the last bronze commit at or below it (a change, a heartbeat or a marker: commits come in
-- position order, so silver holds every change committed before it), the last change, and the
-- latest `changelake-ingest verify` result. Appended,
-- so the rows of earlier runs stay as their certificates; a run in which none of its inputs got a
-- Delta commit (nothing loaded, no new verify) adds nothing and starts no Spark job (skip_when). A
-- run that loaded no bound (loaded_bounds empty: only part of silver selected) certifies nothing.
-- The run's certificate is also the node's result message in run_results.json (report_completeness).

{%- set bounds_query -%}
    select
        loaded_bounds.source,
        loaded_bounds.loaded_safe_lsn,
        max(change_activity.last_commit_lsn) as last_change_lsn
    from {{ ref('loaded_bounds') }} as loaded_bounds
    left join {{ ref('fct_change_activity') }} as change_activity
        on
            loaded_bounds.source = change_activity.source
            and change_activity.last_commit_lsn <= loaded_bounds.loaded_safe_lsn
    group by loaded_bounds.source, loaded_bounds.loaded_safe_lsn
{%- endset %}
{#- None outside a run (compile, sqlfluff's templater), in a unit test and at parse time: the
    join alone decides. #}
{%- set bounds = none if flags.WHICH not in ['run', 'build', 'retry']
    else changelake.query_rows_at_execution(bounds_query) %}
{%- set pruned = ['false'] %}
{%- for row in bounds or [] %}
    {%- do pruned.append(
        '(bronze_commits.source = ' ~ changelake.sql_literal(row.source)
        ~ ' and bronze_commits.commit_lsn between ' ~ changelake.sql_literal(row.get('last_change_lsn', 0))
        ~ ' and ' ~ changelake.sql_literal(row.loaded_safe_lsn) ~ ')') %}
{%- endfor %}
{%- set bounds_predicate = 'true' if bounds is none else '(' ~ pruned | join(' or ') ~ ')' %}

with

loaded_bounds as (

    select * from {{ ref('loaded_bounds') }}

),

change_activity as (

    select * from {{ ref('fct_change_activity') }}

),

verification_runs as (

    select * from {{ ref('verification_runs') }}

),

bronze_commits as (

    select
        source,
        commit_lsn,
        commit_timestamp
    from {{ source('bronze', 'wal_events') }}

),

last_commits as (

    -- The last bronze commit at or below each source's loaded bound, heartbeats included, so an idle
    -- but healthy source is certified through its latest heartbeat, not its last change (as
    -- `dbt source freshness` measures bronze, macro bronze_visible_through). The bounds and each
    -- source's last change, read first as literals, let Delta skip the files before the last change.
    select
        bronze_commits.source,
        max_by(bronze_commits.commit_timestamp, bronze_commits.commit_lsn) as last_commit_at
    from bronze_commits
    inner join loaded_bounds
        on bronze_commits.source = loaded_bounds.source
    where
        bronze_commits.commit_lsn <= loaded_bounds.loaded_safe_lsn
        and {{ bounds_predicate }}
    group by bronze_commits.source

),

last_changes as (

    -- The last counted change at or below each source's loaded bound (hourly counts: small).
    select
        change_activity.source,
        max(change_activity.last_seq) as last_change_seq,
        max_by(change_activity.last_commit_lsn, change_activity.last_seq) as last_change_lsn,
        max_by(change_activity.last_event_at, change_activity.last_seq) as last_change_at
    from change_activity
    inner join loaded_bounds
        on change_activity.source = loaded_bounds.source
    where change_activity.last_commit_lsn <= loaded_bounds.loaded_safe_lsn
    group by change_activity.source

),

latest_verification as (

    -- Each table's latest verification; the source's latest run among them.
    select
        source,
        max_by(run_id, finished_at) as last_verify_run_id,
        max(finished_at) as last_verified_at,
        max_by(position, finished_at) as last_verified_position,
        count(*) as tables_verified,
        count_if(status = 'mismatch') as tables_mismatched,
        count_if(status = 'not_verified') as tables_not_verified
    from verification_runs
    where is_latest
    group by source

),

final as (

    select
        loaded_bounds.source,
        '{{ invocation_id }}' as run_id,
        cast('{{ run_started_at.strftime("%Y-%m-%d %H:%M:%S.%f") }}' as timestamp) as run_started_at,
        loaded_bounds.loaded_safe_lsn as complete_through_lsn,
        greatest(last_commits.last_commit_at, last_changes.last_change_at) as complete_through_commit_at,
        last_changes.last_change_seq,
        last_changes.last_change_lsn,
        latest_verification.last_verify_run_id,
        latest_verification.last_verified_at,
        latest_verification.last_verified_position,
        case
            when latest_verification.source is null then null
            when latest_verification.tables_mismatched > 0 then 'mismatch'
            when latest_verification.tables_not_verified > 0 then 'not_verified'
            else 'equal'
        end as verify_status,
        coalesce(latest_verification.tables_verified, 0) as tables_verified,
        current_timestamp() as recorded_at
    from loaded_bounds
    left join last_commits
        on loaded_bounds.source = last_commits.source
    left join last_changes
        on loaded_bounds.source = last_changes.source
    left join latest_verification
        on loaded_bounds.source = latest_verification.source

)

select * from final
