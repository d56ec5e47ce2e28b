{{ config(materialized='changelake_table', skip_when='inputs_unchanged') }}

-- Not rewritten when bronze.source_relations is at the Delta version the last build read
-- (skip_when): its one input, so a round that only moved positions (a drain marker, heartbeats)
-- leaves it, and it does not wait for the positions' read (changelake_run_state).

-- One row per column of each source table's latest shape (bronze.source_relations), in table
-- order; the gold typed models are generated from it (macro typed_current_state).

with

source_relations as (

    select * from {{ source('bronze', 'source_relations') }}

),

latest_shapes as (

    select *
    from source_relations
    qualify
        row_number() over (
            partition by source, table_schema, table_name
            order by first_seen_lsn desc, ingested_at desc
        ) = 1

),

shape_columns as (

    select
        latest_shapes.source,
        latest_shapes.table_schema,
        latest_shapes.table_name,
        latest_shapes.shape_hash,
        latest_shapes.first_seen_lsn,
        shape_column.position + 1 as ordinal_position,
        shape_column.col.name as column_name,
        shape_column.col.type_name,
        shape_column.col.json_kind,
        shape_column.col.is_key,
        shape_column.col.pk_position,
        shape_column.col.fields
    from latest_shapes
        lateral view posexplode(latest_shapes.columns) shape_column as position, col

),

final as (

    select
        *,
        {{ spark_type_for_pg_type('type_name', 'fields') }} as spark_type
    from shape_columns

)

select * from final
