{{
    config(
        unique_key=['source', 'table_schema', 'table_name', 'record_pk'],
        incremental_strategy='merge',
        skip_when='nothing_new',
        merge_guard=['commit_lsn', 'commit_index'],
        merge_prune_by=['source', 'table_schema', 'table_name'],
        partition_by=['source', 'table_schema', 'table_name'],
        tblproperties={'delta.enableDeletionVectors': 'true'},
        post_hook="drop table if exists {{ this }}__dbt_batch",
    )
}}

-- One row per source record: its state after the last event for its key in position order
-- (DESIGN §6), snapshot page rows included where DESIGN §5 places them (snapshot_rows_placed).
-- Each run folds the new events and the newly placed snapshot rows of every touched key, in
-- position order, over the key's current row; the result is merged with a position guard (macro
-- guarded_merge_sql).

{%- set bounds = consumer_records_scan_bounds() %}

with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

snapshot_rows_placed as (

    select * from {{ ref('snapshot_rows_placed') }}

),

{% if is_incremental() %}
    current_records as (

        -- Only the partitions this run touches are read (the stored rows of other tables cannot
        -- change).
        select * from {{ this }} as stored_records
        {% if bounds.stored_rows is not none %}
            where {{ partitions_predicate(
                'stored_records', ['source', 'table_schema', 'table_name'], bounds.touched_partitions
            ) }}
        {% endif %}

    ),

    stored_positions as (

        -- An event that changed no row (e.g. a truncate of an empty table) is simply folded again
        -- next run, which changes nothing. Snapshot rows above max_commit_lsn are folded (again:
        -- idempotently) now; those at or below it were placed before the run that stored it.
        {{ rows_as_relation(bounds.stored_rows, [
            ['source', 'string'],
            ['max_seq', 'bigint'],
            ['max_commit_lsn', 'bigint'],
        ], bounds.stored_positions_query) }}

    ),
{% endif %}

new_events as (

    select sequin_events.*
    from sequin_events
    {% if is_incremental() %}
        -- Above the stored max seq of a source with stored rows (none when they all come from
        -- snapshot pages: then every event), or every event of a source without stored rows.
        inner join stored_positions
            on sequin_events.source = stored_positions.source
        where
            sequin_events.seq > coalesce(stored_positions.max_seq, 0)
            {% if bounds.stored_rows is not none %}
                and {{ bounds.stored_sources_events_filter }}
            {% endif %}
        union all
        select sequin_events.*
        from sequin_events
        left anti join stored_positions
            on sequin_events.source = stored_positions.source
        {% if bounds.stored_rows is not none %}
            where {{ bounds.other_sources_events_filter }}
        {% endif %}
    {% endif %}

),

new_snapshot_rows as (

    -- Surviving placed rows above the stored max position of a source with stored rows, or every
    -- one of a source without stored rows.
    select snapshot_rows_placed.*
    from snapshot_rows_placed
    {% if is_incremental() %}
        inner join stored_positions
            on snapshot_rows_placed.source = stored_positions.source
        where
            not snapshot_rows_placed.is_superseded
            and snapshot_rows_placed.commit_lsn > stored_positions.max_commit_lsn
            {% if bounds.stored_rows is not none %}
                and {{ bounds.stored_sources_snapshot_rows_filter }}
            {% endif %}
        union all
        select snapshot_rows_placed.*
        from snapshot_rows_placed
        left anti join stored_positions
            on snapshot_rows_placed.source = stored_positions.source
        where
            not snapshot_rows_placed.is_superseded
            {% if bounds.stored_rows is not none %}
                and {{ bounds.other_sources_snapshot_rows_filter }}
            {% endif %}
    {% else %}
        where not snapshot_rows_placed.is_superseded
    {% endif %}

),

event_key_changes as (

    {{ event_keys(
        'new_events',
        [
            'source', 'table_schema', 'table_name', 'action', 'commit_lsn', 'commit_index', 'seq',
            'commit_timestamp', 'record', 'old_record', 'old_record_pk', 'unchanged_toast',
        ],
    ) }}

),

{{ moved_toast_values(
    'new_events', 'new_snapshot_rows', 'current_records' if is_incremental() else none, needed=bounds.moves_toast
) }},

row_changes as (

    -- insert and update upsert their key; a delete tombstones it, and so does a primary-key
    -- change for its old key (DESIGN §6).
    select
        event_key_changes.source,
        event_key_changes.table_schema,
        event_key_changes.table_name,
        event_key_changes.record_pk,
        case
            when event_key_changes.action = 'delete' or event_key_changes.is_old_key then 'delete'
            else 'upsert'
        end as change_kind,
        event_key_changes.commit_lsn,
        event_key_changes.commit_index,
        event_key_changes.seq,
        event_key_changes.commit_timestamp,
        case
            when event_key_changes.is_old_key then cast(null as string)
            else event_key_changes.record
        end as record,
        coalesce(moved_toast_values.old_record, event_key_changes.old_record) as old_record,
        case
            when event_key_changes.is_old_key then cast(array() as array<string>)
            else event_key_changes.unchanged_toast
        end as unchanged_toast,
        case
            when event_key_changes.action = 'delete' or event_key_changes.is_old_key then -1
            when
                event_key_changes.action = 'insert'
                or (
                    event_key_changes.old_record_pk is not null
                    and event_key_changes.old_record_pk != event_key_changes.record_pk
                )
                then 1
            else 0
        end as occupancy_delta
    from event_key_changes
    left join moved_toast_values
        on
            event_key_changes.source = moved_toast_values.source
            and event_key_changes.record_pk = moved_toast_values.record_pk
            and event_key_changes.commit_lsn = moved_toast_values.commit_lsn
            and event_key_changes.commit_index = moved_toast_values.commit_index
            and not event_key_changes.is_old_key

),

snapshot_changes as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        'snapshot' as change_kind,
        commit_lsn,
        commit_index,
        cast(null as bigint) as seq,
        read_at as commit_timestamp,
        record,
        cast(null as string) as old_record,
        cast(array() as array<string>) as unchanged_toast,
        0 as occupancy_delta
    from new_snapshot_rows

),

truncates as (

    select
        new_events.source,
        new_events.commit_lsn,
        new_events.commit_index,
        new_events.seq,
        new_events.commit_timestamp,
        {{ truncated_table_parts('truncated.truncated_table') }}
    from new_events
        lateral view explode(new_events.truncated_tables) truncated as truncated_table
    where new_events.action = 'truncate'

),

-- ST03 is excluded here: only an incremental run (which has stored keys) reads this CTE.
truncated_tables as (  -- noqa: ST03

    select distinct
        source,
        table_schema,
        table_name
    from truncates

),

keyed_changes as (

    select * from row_changes
    union all
    select * from snapshot_changes

),

truncated_keys as (

    -- A truncate is an event for every key of its table: the keys changed in this batch and
    -- (incrementally) the keys already stored.
    select distinct
        source,
        table_schema,
        table_name,
        record_pk
    from keyed_changes
    {% if is_incremental() %}
        union
        select
            current_records.source,
            current_records.table_schema,
            current_records.table_name,
            current_records.record_pk
        from current_records
        inner join truncated_tables
            on
                current_records.source = truncated_tables.source
                and current_records.table_schema = truncated_tables.table_schema
                and current_records.table_name = truncated_tables.table_name
    {% endif %}

),

truncate_changes as (

    select
        truncates.source,
        truncates.table_schema,
        truncates.table_name,
        truncated_keys.record_pk,
        'truncate' as change_kind,
        truncates.commit_lsn,
        truncates.commit_index,
        truncates.seq,
        truncates.commit_timestamp,
        cast(null as string) as record,
        cast(null as string) as old_record,
        cast(array() as array<string>) as unchanged_toast,
        0 as occupancy_delta
    from truncates
    inner join truncated_keys
        on
            truncates.source = truncated_keys.source
            and truncates.table_schema = truncated_keys.table_schema
            and truncates.table_name = truncated_keys.table_name

),

all_changes as (

    select * from keyed_changes
    union all
    select * from truncate_changes

),

key_histories as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        array_sort(collect_list(struct(
            commit_lsn,
            commit_index,
            seq,
            commit_timestamp,
            change_kind,
            record,
            old_record,
            unchanged_toast,
            occupancy_delta
        ))) as changes
    from all_changes
    group by source, table_schema, table_name, record_pk

),

starting_states as (

    select
        key_histories.*,
        {% if is_incremental() %}
            current_records.record_pk is not null as has_current,
            current_records.record as current_record,
            current_records.deleted as current_deleted,
            current_records.deleted_at as current_deleted_at,
            current_records.needs_reread as current_needs_reread,
            current_records.commit_lsn as current_commit_lsn,
            current_records.commit_index as current_commit_index,
            current_records.seq as current_seq,
            current_records.origin as current_origin,
            current_records.updated_at as current_updated_at
        {% else %}
            false as has_current,
            cast(null as string) as current_record,
            cast(null as boolean) as current_deleted,
            cast(null as timestamp) as current_deleted_at,
            cast(null as boolean) as current_needs_reread,
            cast(null as bigint) as current_commit_lsn,
            cast(null as int) as current_commit_index,
            cast(null as bigint) as current_seq,
            cast(null as string) as current_origin,
            cast(null as timestamp) as current_updated_at
        {% endif %}
    from key_histories
    {% if is_incremental() %}
        left join current_records
            on
                key_histories.source = current_records.source
                and key_histories.table_schema = current_records.table_schema
                and key_histories.table_name = current_records.table_name
                and key_histories.record_pk = current_records.record_pk
    {% endif %}

),

folded as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        has_current,
        current_commit_lsn,
        current_commit_index,
        {{ fold_record_changes(
            'changes',
            "named_struct(
                'is_present', has_current,
                'record', current_record,
                'deleted', current_deleted,
                'deleted_at', current_deleted_at,
                'needs_reread', current_needs_reread,
                'commit_lsn', current_commit_lsn,
                'commit_index', current_commit_index,
                'seq', current_seq,
                'origin', current_origin,
                'updated_at', current_updated_at,
                'occupants', cast(null as int)
            )"
        ) }} as record_state
    from starting_states

),

final as (

    select
        folded.source,
        folded.table_schema,
        folded.table_name,
        folded.record_pk,
        folded.record_state.record,
        folded.record_state.deleted,
        folded.record_state.deleted_at,
        folded.record_state.needs_reread,
        folded.record_state.commit_lsn,
        folded.record_state.commit_index,
        folded.record_state.seq,
        folded.record_state.origin,
        folded.record_state.updated_at
    from folded
    where
        folded.record_state.is_present
        and (
            not folded.has_current
            or folded.record_state.commit_lsn > folded.current_commit_lsn
            or (
                folded.record_state.commit_lsn = folded.current_commit_lsn
                and folded.record_state.commit_index > folded.current_commit_index
            )
        )

)

select * from final
