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
    )
}}

-- One row per version of a source record (SCD type 2): each live state a record had, from the
-- change that produced it (valid_from) to the change that ended it (valid_to: the next update, a
-- delete or a truncate), in source position order. The states are consumer_records' (DESIGN §6):
-- the same changes (sequin_events and snapshot_rows_placed), folded by the same state machine
-- (record_change_step), but every intermediate state is kept. A deleted record has no current
-- version. Each run folds the new changes of every touched key over its current version, closes
-- that version (only rows of the is_current partition are read or matched) and appends the new
-- versions; the merge has consumer_records' position guard.

{%- set stored_positions_query -%}
    -- An applied event left its seq on the version it opened or closed; a placed snapshot row its
    -- position on the version it opened.
    select
        source,
        greatest(max(valid_from_seq), max(valid_to_seq)) as max_seq,
        greatest(max(valid_from_lsn), max(valid_to_lsn)) as max_commit_lsn
    from {{ this }}
    group by source
{%- endset -%}
{%- set bounds = consumer_records_scan_bounds(stored_positions_query) %}

with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

snapshot_rows_placed as (

    select * from {{ ref('snapshot_rows_placed') }}

),

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

    stored_positions as (

        -- An event that changed no version (a delete of an unknown key, a truncate of a table with
        -- no live row) is folded again next run, which again changes nothing.
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
    'new_events', 'new_snapshot_rows', 'current_versions' if is_incremental() else none, needed=bounds.moves_toast
) }},

row_changes as (

    -- As in consumer_records; change_action is what a version's started_by / ended_by says (the old
    -- key of a primary-key change is deleted).
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
        end as occupancy_delta,
        case when event_key_changes.is_old_key then 'delete' else event_key_changes.action end as change_action
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
        0 as occupancy_delta,
        'snapshot' as change_action
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

-- ST03 is excluded here: only an incremental run (which has stored versions) reads this CTE.
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
    -- (incrementally) the keys with an open version.
    select distinct
        source,
        table_schema,
        table_name,
        record_pk
    from keyed_changes
    {% if is_incremental() %}
        union
        select
            current_versions.source,
            current_versions.table_schema,
            current_versions.table_name,
            current_versions.record_pk
        from current_versions
        inner join truncated_tables
            on
                current_versions.source = truncated_tables.source
                and current_versions.table_schema = truncated_tables.table_schema
                and current_versions.table_name = truncated_tables.table_name
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
        0 as occupancy_delta,
        'truncate' as change_action
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
