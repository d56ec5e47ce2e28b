{% macro record_change_rows(events, snapshot_rows) %}
    {#-
        The change log both folds read (model record_changes; consumer_records and record_history
        inline it when they do not read that model): a SELECT of one row per change of a key, from
        `events` (sequin_events rows) and `snapshot_rows` (surviving snapshot_rows_placed rows),
        with the columns source, table_schema, table_name, record_pk, change_kind, change_action,
        commit_lsn, commit_index, seq, commit_timestamp, record, old_record, old_record_pk,
        unchanged_toast, occupancy_delta (DESIGN §5, §6):
        - an insert or update upserts its key (change_kind 'upsert'); a delete tombstones it, and
          so does a primary-key change for its old key ('delete'; its change_action is 'delete',
          what record_history's started_by / ended_by says);
        - a placed snapshot row is a 'snapshot' change at its position; an absent row (a key a
          completed whole-table snapshot did not find, no record) is an 'absent' change, which
          tombstones a live key like a truncate;
        - a truncate is one 'truncate' row per truncated table, with a null record_pk: each fold
          expands it to the keys it holds (macro keyed_record_changes).
        occupancy_delta counts the rows a change brings onto (+1) or takes off (-1) the key.
        old_record is the event's old tuple as sent; a fold completes it for a key change with
        unchanged TOAST columns (macro moved_toast_values).
    -#}
    select
        event_key_changes.source,
        event_key_changes.table_schema,
        event_key_changes.table_name,
        event_key_changes.record_pk,
        case
            when event_key_changes.action = 'delete' or event_key_changes.is_old_key then 'delete'
            else 'upsert'
        end as change_kind,
        case when event_key_changes.is_old_key then 'delete' else event_key_changes.action end as change_action,
        event_key_changes.commit_lsn,
        event_key_changes.commit_index,
        event_key_changes.seq,
        event_key_changes.commit_timestamp,
        case
            when event_key_changes.is_old_key then cast(null as string)
            else event_key_changes.record
        end as record,
        event_key_changes.old_record,
        event_key_changes.old_record_pk,
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
    from (
        {{ event_keys(
            events,
            [
                'source', 'table_schema', 'table_name', 'action', 'commit_lsn', 'commit_index', 'seq',
                'commit_timestamp', 'record', 'old_record', 'old_record_pk', 'unchanged_toast',
            ],
        ) }}
    ) as event_key_changes
    union all
    select
        placed.source,
        placed.table_schema,
        placed.table_name,
        placed.record_pk,
        case when placed.record is null then 'absent' else 'snapshot' end as change_kind,
        case when placed.record is null then 'absent' else 'snapshot' end as change_action,
        placed.commit_lsn,
        placed.commit_index,
        cast(null as bigint) as seq,
        placed.read_at as commit_timestamp,
        placed.record,
        cast(null as string) as old_record,
        cast(null as string) as old_record_pk,
        cast(array() as array<string>) as unchanged_toast,
        0 as occupancy_delta
    from {{ snapshot_rows }} as placed
    union all
    select
        truncating.source,
        {{ truncated_table_parts('truncated.truncated_table') }},
        cast(null as string) as record_pk,
        'truncate' as change_kind,
        'truncate' as change_action,
        truncating.commit_lsn,
        truncating.commit_index,
        truncating.seq,
        truncating.commit_timestamp,
        cast(null as string) as record,
        cast(null as string) as old_record,
        cast(null as string) as old_record_pk,
        cast(array() as array<string>) as unchanged_toast,
        0 as occupancy_delta
    from {{ events }} as truncating
        lateral view explode(truncating.truncated_tables) truncated as truncated_table
    where truncating.action = 'truncate'
{%- endmacro %}
