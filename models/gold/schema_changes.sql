{{
    config(
        skip_when='inputs_unchanged',
        skip_inputs=['source_relations'],
        rebuild_when_arrived={
            'input': 'sequin_events', 'column': 'commit_lsn',
            'null_column': 'changed_at', 'position_column': 'changed_at_lsn',
        },
    )
}}

-- One row per change of a captured table's shape, as bronze.source_relations recorded it: the
-- table's first shape (table_added), then between each shape and the next one, each column added,
-- dropped, renamed or retyped and a changed key. Classified as ingest classifies them for its
-- schema_changed alert (ingest/sources/postgres/schema_changes.py, shape_change_kinds): when both
-- shapes carry every column's attnum (PostgreSQL's column identity, kept across a rename), a column
-- is the one with its attnum before; otherwise (shapes recorded before attnums were) a renamed
-- column keeps its place, so when both shapes have as many columns, a name gone and a new name at
-- the same place are one column renamed. Rebuilt only when bronze.source_relations got a Delta
-- commit (skip_inputs), or when sequin_events now holds the first event of a change whose
-- changed_at is still null (rebuild_when_arrived): sequin_events gives commit times only, so its
-- every batch need not rewrite this table (26 s of a 100k-event build beside the silver chain).
-- A change recorded where no event is (a table's first shape, a restart meeting a new catalog)
-- keeps a null changed_at and costs one pruned lookup per run.

{# The commit time of each shape's first event: a literal list of positions lets Delta skip the
    files of sequin_events that hold none of them (a join alone reads them all). None outside a
    run (compile, sqlfluff's templater), in a unit test and at parse time: the join alone decides. #}
{% set shape_positions = none if flags.WHICH not in ['run', 'build', 'retry'] else query_rows_at_execution(
    'select distinct first_seen_lsn from ' ~ source('bronze', 'source_relations')
    ~ ' where first_seen_lsn is not null') %}

with

source_relations as (

    select * from {{ source('bronze', 'source_relations') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

-- Each recorded shape with the one before it; a shape recorded again (a restart meets the same
-- catalog) is not a change.
ordered_shapes as (

    select
        source,
        table_schema,
        table_name,
        replica_identity,
        columns,
        shape_hash,
        first_seen_lsn,
        ingested_at,
        lag(shape_hash) over table_shapes as previous_shape_hash,
        lag(columns) over table_shapes as previous_columns,
        lag(replica_identity) over table_shapes as previous_replica_identity
    from source_relations
    window table_shapes as (
        partition by source, table_schema, table_name
        order by first_seen_lsn, ingested_at
    )

),

shape_changes as (

    select
        *,
        transform(columns, shape_column -> shape_column.name) as column_names,
        transform(previous_columns, shape_column -> shape_column.name) as previous_column_names,
        size(columns) = size(previous_columns) as same_width,
        not exists(columns, shape_column -> shape_column.attnum is null)
        and not exists(previous_columns, shape_column -> shape_column.attnum is null) as by_attnum
    from ordered_shapes
    where previous_shape_hash is null or previous_shape_hash != shape_hash

),

-- Each column of a new shape with the name it had in the shape before (null: it is new).
new_columns as (

    select
        shape_changes.source,
        shape_changes.table_schema,
        shape_changes.table_name,
        shape_changes.shape_hash,
        shape_changes.first_seen_lsn,
        shape_changes.ingested_at,
        new_column.position,
        new_column.col.name as column_name,
        new_column.col.type_name,
        new_column.col.pk_position,
        case
            when shape_changes.by_attnum
                then try_element_at(
                        filter(
                            shape_changes.previous_columns,
                            old_column -> old_column.attnum = new_column.col.attnum
                        ),
                        1
                    ).name
            when array_contains(shape_changes.previous_column_names, new_column.col.name)
                then new_column.col.name
            when
                shape_changes.same_width
                and not array_contains(
                    shape_changes.column_names,
                    element_at(shape_changes.previous_columns, new_column.position + 1).name
                )
                then element_at(shape_changes.previous_columns, new_column.position + 1).name
        end as previous_name
    from shape_changes
        lateral view posexplode(shape_changes.columns) new_column as position, col
    where shape_changes.previous_shape_hash is not null

),

previous_columns as (

    select
        shape_changes.source,
        shape_changes.table_schema,
        shape_changes.table_name,
        shape_changes.shape_hash,
        shape_changes.first_seen_lsn,
        shape_changes.ingested_at,
        old_column.col.name as column_name,
        old_column.col.type_name,
        old_column.col.pk_position
    from shape_changes
        lateral view posexplode(shape_changes.previous_columns) old_column as position, col
    where shape_changes.previous_shape_hash is not null

),

-- Each column both shapes have (under the same name or renamed), with its type before.
kept_columns as (

    select
        new_columns.source,
        new_columns.table_schema,
        new_columns.table_name,
        new_columns.shape_hash,
        new_columns.first_seen_lsn,
        new_columns.ingested_at,
        new_columns.column_name,
        new_columns.previous_name,
        new_columns.type_name,
        previous_columns.type_name as previous_type
    from new_columns
    inner join previous_columns
        on
            new_columns.source = previous_columns.source
            and new_columns.table_schema = previous_columns.table_schema
            and new_columns.table_name = previous_columns.table_name
            and new_columns.first_seen_lsn = previous_columns.first_seen_lsn
            and new_columns.ingested_at = previous_columns.ingested_at
            and new_columns.previous_name = previous_columns.column_name

),

column_changes as (

    select
        source,
        table_schema,
        table_name,
        shape_hash,
        first_seen_lsn,
        ingested_at,
        'added' as change_kind,
        column_name,
        cast(null as string) as previous_column_name,
        cast(null as string) as previous_definition,
        type_name as new_definition
    from new_columns
    where previous_name is null
    union all
    select
        source,
        table_schema,
        table_name,
        shape_hash,
        first_seen_lsn,
        ingested_at,
        'renamed' as change_kind,
        column_name,
        previous_name as previous_column_name,
        previous_type as previous_definition,
        type_name as new_definition
    from kept_columns
    where previous_name != column_name
    union all
    -- Retyped: the type or its modifier changed (format_type shows both), through a rename too.
    select
        source,
        table_schema,
        table_name,
        shape_hash,
        first_seen_lsn,
        ingested_at,
        'retyped' as change_kind,
        column_name,
        previous_name as previous_column_name,
        previous_type as previous_definition,
        type_name as new_definition
    from kept_columns
    where type_name != previous_type
    union all
    select
        previous_columns.source,
        previous_columns.table_schema,
        previous_columns.table_name,
        previous_columns.shape_hash,
        previous_columns.first_seen_lsn,
        previous_columns.ingested_at,
        'dropped' as change_kind,
        previous_columns.column_name,
        previous_columns.column_name as previous_column_name,
        previous_columns.type_name as previous_definition,
        cast(null as string) as new_definition
    from previous_columns
    left anti join new_columns
        on
            previous_columns.source = new_columns.source
            and previous_columns.table_schema = new_columns.table_schema
            and previous_columns.table_name = new_columns.table_name
            and previous_columns.first_seen_lsn = new_columns.first_seen_lsn
            and previous_columns.ingested_at = new_columns.ingested_at
            and previous_columns.column_name = new_columns.previous_name

),

-- The key as the previous shape named it (a renamed key column is the same key), in key order.
shape_keys as (

    select
        source,
        table_schema,
        table_name,
        first_seen_lsn,
        ingested_at,
        array_sort(collect_list(
            case when pk_position is not null then named_struct('pk_position', pk_position, 'name', previous_name) end
        )) as key_then_names,
        array_sort(collect_list(
            case when pk_position is not null then named_struct('pk_position', pk_position, 'name', column_name) end
        )) as key_names
    from new_columns
    group by source, table_schema, table_name, first_seen_lsn, ingested_at

),

previous_keys as (

    select
        source,
        table_schema,
        table_name,
        first_seen_lsn,
        ingested_at,
        array_sort(collect_list(
            case when pk_position is not null then named_struct('pk_position', pk_position, 'name', column_name) end
        )) as key_names
    from previous_columns
    group by source, table_schema, table_name, first_seen_lsn, ingested_at

),

key_changes as (

    select
        shape_changes.source,
        shape_changes.table_schema,
        shape_changes.table_name,
        shape_changes.shape_hash,
        shape_changes.first_seen_lsn,
        shape_changes.ingested_at,
        'key_changed' as change_kind,
        cast(null as string) as column_name,
        cast(null as string) as previous_column_name,
        concat(
            '(', array_join(transform(previous_keys.key_names, key_column -> key_column.name), ', '),
            ') replica identity ', {{ replica_identity_name('shape_changes.previous_replica_identity') }}
        ) as previous_definition,
        concat(
            '(', array_join(transform(shape_keys.key_names, key_column -> key_column.name), ', '),
            ') replica identity ', {{ replica_identity_name('shape_changes.replica_identity') }}
        ) as new_definition
    from shape_changes
    inner join shape_keys
        on
            shape_changes.source = shape_keys.source
            and shape_changes.table_schema = shape_keys.table_schema
            and shape_changes.table_name = shape_keys.table_name
            and shape_changes.first_seen_lsn = shape_keys.first_seen_lsn
            and shape_changes.ingested_at = shape_keys.ingested_at
    inner join previous_keys
        on
            shape_changes.source = previous_keys.source
            and shape_changes.table_schema = previous_keys.table_schema
            and shape_changes.table_name = previous_keys.table_name
            and shape_changes.first_seen_lsn = previous_keys.first_seen_lsn
            and shape_changes.ingested_at = previous_keys.ingested_at
    where
        transform(shape_keys.key_then_names, key_column -> key_column.name)
        != transform(previous_keys.key_names, key_column -> key_column.name)
        or shape_changes.replica_identity != shape_changes.previous_replica_identity

),

tables_added as (

    select
        source,
        table_schema,
        table_name,
        shape_hash,
        first_seen_lsn,
        ingested_at,
        'table_added' as change_kind,
        cast(null as string) as column_name,
        cast(null as string) as previous_column_name,
        cast(null as string) as previous_definition,
        cast(null as string) as new_definition
    from shape_changes
    where previous_shape_hash is null

),

all_changes as (

    select * from tables_added
    union all
    select * from column_changes
    union all
    select * from key_changes

),

commit_times as (

    select
        source,
        commit_lsn,
        min(commit_timestamp) as commit_timestamp
    from sequin_events
    where
        commit_lsn in (select all_changes.first_seen_lsn from all_changes)
        and {{ 'true' if shape_positions is none else 'commit_lsn in ('
            ~ (shape_positions | map(attribute='first_seen_lsn') | list + [-1]) | join(', ') ~ ')' }}
    group by source, commit_lsn

),

final as (

    select
        all_changes.source,
        all_changes.table_schema,
        all_changes.table_name,
        all_changes.change_kind,
        all_changes.column_name,
        all_changes.previous_column_name,
        all_changes.previous_definition,
        all_changes.new_definition,
        all_changes.shape_hash,
        all_changes.first_seen_lsn as changed_at_lsn,
        commit_times.commit_timestamp as changed_at,
        all_changes.ingested_at as recorded_at
    from all_changes
    left join commit_times
        on
            all_changes.source = commit_times.source
            and all_changes.first_seen_lsn = commit_times.commit_lsn

)

select * from final
