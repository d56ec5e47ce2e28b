{#- No unique_key: an append ignores it. The query makes the event key unique (deduplicated,
    only positions above the loaded one) and the yml tests it. -#}
{{
    config(
        incremental_strategy='append',
        skip_when='nothing_new',
        partition_by=['source'],
    )
}}

-- One row per distinct change event (DESIGN §6). Each run appends the events above what the table
-- already holds and at or below the source's safe bound, so a later run never meets an event
-- older than one it has numbered, and seq is never reused or renumbered.

{%- set bounds = sequin_events_scan_bounds() %}

with

wal_events as (

    select * from {{ source('bronze', 'wal_events') }}

),

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

{% if is_incremental() %}
    loaded_positions as (

        -- seq increases with position, so the max-seq row holds the source's max position.
        {{ rows_as_relation(bounds.loaded_rows, [
            ['source', 'string'],
            ['max_seq', 'bigint'],
            ['max_commit_lsn', 'bigint'],
            ['max_commit_index', 'int'],
        ], bounds.loaded_positions_query) }}

    ),
{% endif %}

change_events as (

    -- Heartbeats and other logical messages carry no row change.
    select wal_events.*
    from wal_events
    inner join safe_bounds
        on wal_events.source = safe_bounds.source
    where
        wal_events.action in ('insert', 'update', 'delete', 'truncate')
        and wal_events.commit_lsn <= safe_bounds.safe_lsn
    {% if bounds.wal_events_filter is not none %}
        and {{ bounds.wal_events_filter }}
    {% endif %}

),

new_events as (

    select
        change_events.*,
        {% if is_incremental() %}
            coalesce(loaded_positions.max_seq, 0) as base_seq
        {% else %}
            cast(0 as bigint) as base_seq
        {% endif %}
    from change_events
    {% if is_incremental() %}
        left join loaded_positions
            on change_events.source = loaded_positions.source
        where
            loaded_positions.source is null
            or change_events.commit_lsn > loaded_positions.max_commit_lsn
            or (
                change_events.commit_lsn = loaded_positions.max_commit_lsn
                and change_events.commit_index > loaded_positions.max_commit_index
            )
    {% endif %}

),

deduplicated as (

    -- A crash between a Delta commit and ingest's bookkeeping can append an event twice; the
    -- copies are identical, keep the first one appended.
    select *
    from new_events
    qualify
        row_number() over (
            partition by source, commit_lsn, commit_index
            order by ingested_at, writer_id
        ) = 1

),

parsed as (

    select
        *,
        from_json(record, 'map<string, string>') as record_text,
        from_json(old_record, 'map<string, string>') as old_record_text,
        from_json(old_record, 'map<string, variant>') as old_record_values
    from deduplicated

),

compared as (

    -- Old values of the columns the update changed (only columns present in both tuples).
    select
        *,
        map_filter(
            old_record_values,
            (column_name, old_value) -> map_contains_key(record_text, column_name)
            and record_text[column_name] is distinct from old_record_text[column_name]
        ) as changed_old_values
    from parsed

),

final as (

    select
        base_seq + row_number() over (
            partition by source
            order by commit_lsn, commit_index
        ) as seq,
        source,
        source_kind,
        commit_lsn,
        commit_index,
        end_lsn,
        commit_timestamp,
        xid as transaction_id,
        table_schema,
        table_name,
        relation_id,
        action,
        record_pk,
        old_record_pk,
        record,
        old_record,
        case
            when action = 'update' and old_record is not null then to_json(changed_old_values)
        end as changes,
        coalesce(unchanged_toast, cast(array() as array<string>)) as unchanged_toast,
        truncated_tables,
        writer_id,
        ingested_at
    from compared

)

select * from final
