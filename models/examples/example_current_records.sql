{{
    config(
        enabled=var('changelake_examples', false),
        materialized='incremental',
        incremental_strategy='merge',
        unique_key=['source', 'table_schema', 'table_name', 'record_pk'],
        file_format='delta',
        schema='examples',
    )
}}

-- One row per source record, deleted ones included as tombstones (docs/dbt.md, "Your own
-- incremental models"): a user's model over consumer_records. Each run merges the records whose
-- state changed past the highest position it holds per source.

with

changed_records as (

    select * from {{ records_changed_since(this) }} as changed_records

),

final as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        record,
        deleted,
        deleted_at,
        commit_lsn,
        commit_index
    from changed_records

)

select * from final
