{%- set change_positions = {
    'max_seq': 'greatest(max(valid_from_seq), max(valid_to_seq))',
    'max_commit_lsn': 'greatest(max(valid_from_lsn), max(valid_to_lsn))',
} -%}
{{
    config(
        unique_key=['source', 'table_schema', 'table_name', 'record_pk', 'valid_from_lsn', 'valid_from_index'],
        incremental_strategy='merge',
        skip_when='nothing_new',
        merge_guard=['commit_lsn', 'commit_index'],
        merge_prune_by=['source', 'table_schema', 'table_name'],
        incremental_predicates=['dbt_internal_dest.is_current'],
        partition_by=['source', 'table_schema', 'table_name', 'is_current'],
        tblproperties={'delta.enableDeletionVectors': 'true'},
        post_hook="drop table if exists {{ this }}__dbt_batch",
        change_positions=change_positions,
    )
}}

-- One row per version of a source record (SCD type 2): each live state a record had, from the
-- change that produced it (valid_from) to the change that ended it (valid_to: the next update, a
-- delete or a truncate), in source position order. The states are consumer_records' (DESIGN §6):
-- the same changes (sequin_events and snapshot_rows_placed), folded by the same state machine
-- (record_change_step), but every intermediate state is kept. A deleted record has no current
-- version. Each run folds the new changes of every touched key over its current version, closes
-- that version (only rows of the is_current partition are read or matched) and appends the new
-- versions; the merge has consumer_records' position guard. How far it has folded
-- (change_positions): an applied event left its seq on the version it opened or closed, a placed
-- snapshot row its position on the version it opened.

{%- set change_batch = changelake_reads_change_batch() %}
{%- set bounds = consumer_records_scan_bounds(
    change_positions_query(this, change_positions), batch=change_batch
) %}
-- depends_on: {{ ref('record_changes') }}

with

{% if is_incremental() %}
    current_versions as (

        -- The open versions of the tables this run touches: the only stored rows a run can change.
        select * from {{ this }} as stored_versions
        where
            stored_versions.is_current
            {% if bounds.stored_rows is not none %}
                and {{ partitions_predicate(
                    'stored_versions', ['source', 'table_schema', 'table_name'], bounds.touched_partitions
                ) }}
            {% endif %}

    ),
{% endif %}

{{ change_log_ctes(change_batch, bounds, is_incremental()) }},

{{ keyed_record_changes(
    'record_changes', 'current_versions' if is_incremental() else none, moves_toast=bounds.moves_toast,
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
            occupancy_delta,
            change_action
        ))) as changes
    from all_changes
    group by source, table_schema, table_name, record_pk

),

starting_states as (

    -- The fold starts from the key's open version, or from no state. A key whose last version was
    -- closed by a delete or truncate folds the same from no state: every change of the batch is
    -- above that close, and a delete or truncate of a record that is not live opens nothing.
    select
        key_histories.*,
        {% if is_incremental() %}
            current_versions.record_pk is not null as has_current,
            current_versions.record as current_record,
            current_versions.needs_reread as current_needs_reread,
            current_versions.valid_from_lsn as current_valid_from_lsn,
            current_versions.valid_from_index as current_valid_from_index,
            current_versions.valid_from_seq as current_valid_from_seq,
            current_versions.origin as current_origin,
            current_versions.valid_from as current_valid_from,
            current_versions.started_by as current_started_by
        {% else %}
            false as has_current,
            cast(null as string) as current_record,
            cast(null as boolean) as current_needs_reread,
            cast(null as bigint) as current_valid_from_lsn,
            cast(null as int) as current_valid_from_index,
            cast(null as bigint) as current_valid_from_seq,
            cast(null as string) as current_origin,
            cast(null as timestamp) as current_valid_from,
            cast(null as string) as current_started_by
        {% endif %}
    from key_histories
    {% if is_incremental() %}
        left join current_versions
            on
                key_histories.source = current_versions.source
                and key_histories.table_schema = current_versions.table_schema
                and key_histories.table_name = current_versions.table_name
                and key_histories.record_pk = current_versions.record_pk
    {% endif %}

),

state_sequences as (

    -- Every state the key passes through: element 1 is the starting state, then one element per
    -- change, tagged with the change that produced it (a change that changes nothing repeats the
    -- state before it, and is dropped below).
    select
        source,
        table_schema,
        table_name,
        record_pk,
        has_current,
        aggregate(
            changes,
            array(named_struct(
                'state', named_struct(
                    'is_present', has_current,
                    'record', current_record,
                    'deleted', case when has_current then false end,
                    'deleted_at', cast(null as timestamp),
                    'needs_reread', current_needs_reread,
                    'commit_lsn', current_valid_from_lsn,
                    'commit_index', current_valid_from_index,
                    'seq', current_valid_from_seq,
                    'origin', current_origin,
                    'updated_at', current_valid_from,
                    'occupants', cast(null as int)
                ),
                'change_action', current_started_by
            )),
            (states, change) -> concat(states, transform(
                transform(array(element_at(states, -1).state), state -> {{ record_change_step() }}),
                -- a row leaving a key another row moved onto in the same transaction (review W4)
                -- leaves it live: that version is started by an update, not a delete
                next_state -> named_struct(
                    'state', next_state,
                    'change_action', case
                        when change.change_action = 'delete' and not next_state.deleted then 'update'
                        else change.change_action
                    end
                )
            ))
        ) as states
    from starting_states

),

state_changes as (

    -- The starting state and the states a change produced, each with the next one.
    select
        state_sequences.source,
        state_sequences.table_schema,
        state_sequences.table_name,
        state_sequences.record_pk,
        state_sequences.has_current,
        state_steps.step_index,
        state_steps.step.state,
        state_steps.step.change_action,
        lead(state_steps.step) over (
            partition by
                state_sequences.source,
                state_sequences.table_schema,
                state_sequences.table_name,
                state_sequences.record_pk
            order by state_steps.step_index
        ) as next_step
    from state_sequences
        lateral view posexplode(
            filter(
                state_sequences.states,
                (step, i) -> i = 0
                or step.state.commit_lsn
                is distinct from state_sequences.states[greatest(i - 1, 0)].state.commit_lsn
                or step.state.commit_index
                is distinct from state_sequences.states[greatest(i - 1, 0)].state.commit_index
            )
        ) state_steps as step_index, step

),

versions as (

    -- A live state is a version; the state after it ends it. The starting state is written again
    -- only when this run ends it.
    select
        state_changes.source,
        state_changes.table_schema,
        state_changes.table_name,
        state_changes.record_pk,
        state_changes.state.record,
        state_changes.state.updated_at as valid_from,
        state_changes.state.commit_lsn as valid_from_lsn,
        state_changes.state.commit_index as valid_from_index,
        state_changes.state.seq as valid_from_seq,
        state_changes.next_step.state.updated_at as valid_to,
        state_changes.next_step.state.commit_lsn as valid_to_lsn,
        state_changes.next_step.state.commit_index as valid_to_index,
        state_changes.next_step.state.seq as valid_to_seq,
        state_changes.next_step is null as is_current,
        state_changes.change_action as started_by,
        state_changes.next_step.change_action as ended_by,
        state_changes.state.origin,
        state_changes.state.needs_reread,
        coalesce(state_changes.next_step.state.commit_lsn, state_changes.state.commit_lsn) as commit_lsn,
        coalesce(state_changes.next_step.state.commit_index, state_changes.state.commit_index) as commit_index
    from state_changes
    where
        state_changes.state.is_present
        and not state_changes.state.deleted
        and (
            state_changes.step_index > 0
            or (state_changes.has_current and state_changes.next_step is not null)
        )

),

final as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        record,
        valid_from,
        valid_from_lsn,
        valid_from_index,
        valid_from_seq,
        valid_to,
        valid_to_lsn,
        valid_to_index,
        valid_to_seq,
        is_current,
        started_by,
        ended_by,
        origin,
        needs_reread,
        commit_lsn,
        commit_index
    from versions

)

select * from final
