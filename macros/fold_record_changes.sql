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
          the change's record; columns listed in unchanged_toast take their value from the
          change's old tuple (REPLICA IDENTITY FULL; for a key change, completed with the old
          key's values by moved_toast_values), else from the live previous state; with no value
          for one of them the column stays absent and needs_reread is set;
        - delete (and the old key of a primary-key change): a tombstone at the change's position
          that keeps the last known values (the previous state's record, else the delete's
          old_record, which is the key columns unless REPLICA IDENTITY FULL);
        - truncate: tombstones a live row; an already deleted row keeps its own tombstone;
        - absent (a live key a completed whole-table snapshot did not find, docs/snapshots.md):
          the same as a truncate, with origin 'snapshot';
        - a key two rows hold at once inside a transaction (a deferrable key shifted, review W4):
          the state counts the holders (occupants); a delete or leave that leaves one keeps the
          record live at its position; an in-place update while two hold it sets needs_reread.
        updated_at is the commit time of the change that produced the state (not the run time),
        so a full refresh reproduces the incremental result exactly.
    -#}
    aggregate(
        {{ changes }},
        {{ initial_state }},
        (state, change) -> {{ record_change_step() }}
    )
{%- endmacro %}
