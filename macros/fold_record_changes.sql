{% macro fold_record_changes(changes, initial_state) %}
    {#-
        The consumer_records state machine as one fold (Spark `aggregate`) over a key's changes,
        sorted by position, starting from the key's stored row (initial_state; is_present = false
        when there is none). The state and the result are
        struct<is_present, record, deleted, deleted_at, needs_reread, commit_lsn, commit_index, seq,
        origin, updated_at>. Rules (DESIGN §6):
        - a change at or below the state's position is already reflected: skipped (an older event
          never overwrites a newer one);
        - snapshot (a surviving snapshot page row, DESIGN §5): the row is present with the page's
          record, origin 'snapshot', no seq;
        - upsert (insert/update, and the new key of a primary-key change): the row is present with
          the change's record; columns listed in unchanged_toast carry their value forward from
          the live previous state; if the previous state has no value for one of them the column
          stays absent and needs_reread is set;
        - delete (and the old key of a primary-key change): a tombstone at the change's position
          that keeps the last known values (the previous state's record, else the delete's
          old_record, which is the key columns unless REPLICA IDENTITY FULL);
        - truncate: tombstones a live row; an already deleted row keeps its own tombstone.
        updated_at is the commit time of the change that produced the state (not the run time),
        so a full refresh reproduces the incremental result exactly.
    -#}
    {%- set live_record = "case when state.is_present and not state.deleted then state.record end" -%}
    aggregate(
        {{ changes }},
        {{ initial_state }},
        (state, change) -> case
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
                    'updated_at', change.commit_timestamp
                )
            when change.change_kind = 'upsert'
                then named_struct(
                    'is_present', true,
                    'record', case
                        when size(change.unchanged_toast) = 0 then change.record
                        else to_json(map_concat(
                            from_json(change.record, 'map<string, variant>'),
                            map_filter(
                                coalesce(
                                    from_json({{ live_record }}, 'map<string, variant>'),
                                    cast(map() as map<string, variant>)
                                ),
                                (column_name, column_value) -> array_contains(change.unchanged_toast, column_name)
                                and not array_contains(json_object_keys(change.record), column_name)
                            )
                        ))
                    end,
                    'deleted', false,
                    'deleted_at', cast(null as timestamp),
                    'needs_reread', exists(
                        change.unchanged_toast,
                        column_name -> not coalesce(
                            array_contains(json_object_keys({{ live_record }}), column_name), false
                        )
                    ),
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', 'stream',
                    'updated_at', change.commit_timestamp
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
                    'updated_at', change.commit_timestamp
                )
            when change.change_kind = 'truncate' and state.is_present and not state.deleted
                then named_struct(
                    'is_present', true,
                    'record', state.record,
                    'deleted', true,
                    'deleted_at', change.commit_timestamp,
                    'needs_reread', false,
                    'commit_lsn', change.commit_lsn,
                    'commit_index', change.commit_index,
                    'seq', change.seq,
                    'origin', 'stream',
                    'updated_at', change.commit_timestamp
                )
            else state
        end
    )
{%- endmacro %}
