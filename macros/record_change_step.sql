{% macro record_change_step() %}
    {#-
        One step of the consumer_records state machine (DESIGN §6): a SQL expression over two lambda
        variables that the caller binds, `state` (the key's state so far) and `change` (its next
        change in position order), giving the state after the change. The state is
        struct<is_present, record, deleted, deleted_at, needs_reread, commit_lsn, commit_index, seq,
        origin, updated_at, occupants>; the change is struct<commit_lsn, commit_index, seq,
        commit_timestamp, change_kind, record, old_record, unchanged_toast, occupancy_delta, ...>
        (extra fields are ignored). A change
        that does not change the state (older than it, or a truncate of a row that is not live)
        returns `state` itself. fold_record_changes folds a key's changes with it; record_history
        keeps every intermediate state. The rules are listed in fold_record_changes.
    -#}
    {%- set live_record = "case when state.is_present and not state.deleted then state.record end" -%}
    {#- Rows holding the key before the change (review W4): inside one transaction a deferrable key
        can be held by two rows at once (`update t set id = id + 1` moves row 1 onto key 2 before
        row 2 leaves it), so the state counts them, from the live state at the transaction's
        first change of the key. -#}
    {%- set occupants_before -%}
        case
            when change.commit_lsn = state.commit_lsn and state.occupants is not null then state.occupants
            when state.is_present and not state.deleted then 1
            else 0
        end
    {%- endset -%}
    {#- The previous record an unchanged TOAST column takes its value from: the live state, unless
        the change brings a row onto the key (a primary-key change), whose previous values are
        under its old key (they come in the change's old tuple, below). -#}
    {%- set toast_record = "case when change.occupancy_delta = 0 then " ~ live_record ~ " end" -%}
    {#- The value an unchanged TOAST column takes: the change's old tuple's (REPLICA IDENTITY FULL
        sends the whole old row; for a primary-key change the model completes the old tuple with
        the old key's values, macro moved_toast_values), else the previous record's. A null in
        the old tuple is a column it did not carry (the default identity sends the key only): a
        TOASTed value is never null. -#}
    {%- set old_value = "from_json(change.old_record, 'map<string, variant>')[toast_name]" -%}
    {%- set toast_values -%}
        map_from_entries(filter(
            transform(change.unchanged_toast, toast_name -> named_struct(
                'name', toast_name,
                'value', coalesce(
                    case when not is_variant_null({{ old_value }}) then {{ old_value }} end,
                    from_json({{ toast_record }}, 'map<string, variant>')[toast_name]
                )
            )),
            toast_entry -> toast_entry.value is not null
        ))
    {%- endset -%}
    case
            when
                state.commit_lsn is not null
                and (
                    change.commit_lsn < state.commit_lsn
                    or (change.commit_lsn = state.commit_lsn and change.commit_index <= state.commit_index)
                )
                then state
            when change.change_kind = 'snapshot'
                then named_struct(
                    'is_present', true,
                    'record', change.record,
                    'deleted', false,
                    'deleted_at', cast(null as timestamp),
                    'needs_reread', false,
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', 'snapshot',
                    'updated_at', change.commit_timestamp,
                    'occupants', 1
                )
            when change.change_kind = 'upsert'
                then named_struct(
                    'is_present', true,
                    'record', case
                        when size(change.unchanged_toast) = 0 then change.record
                        else to_json(map_concat(
                            from_json(change.record, 'map<string, variant>'),
                            map_filter(
                                {{ toast_values }},
                                (column_name, column_value) -> not array_contains(
                                    json_object_keys(change.record), column_name
                                )
                            )
                        ))
                    end,
                    'deleted', false,
                    'deleted_at', cast(null as timestamp),
                    -- an unchanged TOAST column with no value anywhere
                    'needs_reread', (change.occupancy_delta = 0 and {{ occupants_before }} >= 2)
                    or size({{ toast_values }}) < size(array_distinct(change.unchanged_toast)),
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', 'stream',
                    'updated_at', change.commit_timestamp,
                    'occupants', {{ occupants_before }} + change.occupancy_delta
                )
            when change.change_kind = 'delete' and {{ occupants_before }} >= 2
                then named_struct(
                    'is_present', true,
                    'record', state.record,
                    'deleted', false,
                    'deleted_at', cast(null as timestamp),
                    'needs_reread', state.needs_reread,
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', state.origin,
                    'updated_at', state.updated_at,
                    'occupants', {{ occupants_before }} - 1
                )
            when change.change_kind = 'delete'
                then named_struct(
                    'is_present', true,
                    'record', coalesce(case when state.is_present then state.record end, change.old_record),
                    'deleted', true,
                    'deleted_at', change.commit_timestamp,
                    'needs_reread', false,
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', 'stream',
                    'updated_at', change.commit_timestamp,
                    'occupants', 0
                )
            when change.change_kind in ('truncate', 'absent') and state.is_present and not state.deleted
                then named_struct(
                    'is_present', true,
                    'record', state.record,
                    'deleted', true,
                    'deleted_at', change.commit_timestamp,
                    'needs_reread', false,
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', case when change.change_kind = 'absent' then 'snapshot' else 'stream' end,
                    'updated_at', change.commit_timestamp,
                    'occupants', 0
                )
            else state
        end
{%- endmacro %}
