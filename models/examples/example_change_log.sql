{{
    config(
        enabled=var('changelake_examples', false),
        materialized='incremental',
        incremental_strategy='append',
        file_format='delta',
        schema='examples',
    )
}}

-- One row per change event of the captured tables, appended once each (docs/dbt.md, "Your own
-- incremental models"): a user's model over sequin_events. Each run appends the events past the
-- highest seq it holds per source, up to the run's safe bound; no unique_key is needed, since a
-- re-run after a crash reads from what the table holds, not from what the last run meant to do.

with

changes as (

    select * from {{ changes_since(this) }} as changes

),

final as (

    select
        source,
        seq,
        commit_lsn,
        commit_index,
        commit_timestamp,
        table_schema,
        table_name,
        action,
        record_pk,
        record,
        truncated_tables
    from changes

)

select * from final
