{%- set change_positions = {'max_seq': 'max(seq)', 'max_commit_lsn': 'max(commit_lsn)'} -%}
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
        change_positions=change_positions,
    )
}}

-- One row per source record: its state after the last event for its key in position order
-- (DESIGN §6), snapshot page rows included where DESIGN §5 places them (snapshot_rows_placed).
-- Each run folds the new events and the newly placed snapshot rows of every touched key, in
-- position order, over the key's current row; the result is merged with a position guard (macro
-- guarded_merge_sql).

{%- set change_batch = changelake_reads_change_batch() %}
{%- set bounds = consumer_records_scan_bounds(
    change_positions_query(this, change_positions), batch=change_batch
) %}
-- depends_on: {{ ref('record_changes') }}

with

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
{% endif %}

{{ change_log_ctes(change_batch, bounds, is_incremental()) }},

{{ keyed_record_changes(
    'record_changes', 'current_records' if is_incremental() else none, moves_toast=bounds.moves_toast,
    events=none if change_batch is not none else 'new_events',
    snapshot_rows=none if change_batch is not none else 'new_snapshot_rows',
) }},

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
