{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariants relate rows across models and runs, so a
-- violation can sit in rows this run did not write. A run that left every model it reads
-- unchanged skips it (skip_when_unchanged; var changelake_full_tests runs it anyway).
-- consumer_records against sequin_events (DESIGN §6, §7.1: a record is the state after the last
-- event for its key; deletes are soft), in one test: one aggregate of each key's last event and one
-- join (two tests read the same two tables before). Each failing row names what it breaks,
-- `mismatch`:
-- - every key that has an event has a record (`no record for a key with events`), and a stream
--   record has an event for its key (`stream record without an event for its key`);
-- - a record's position is never below the last event for its key (`record behind the last event
--   for its key`); a stream record's is that event (its own change, or a primary-key change away
--   from it) or a later truncate of its table that deleted it (`stream record past the last event
--   for its key`); a snapshot record's (its page's watermark) may be above it;
-- - a stream record's soft-delete columns and times are those of the event at its position:
--   deleted exactly when deleted_at is set (`deleted and deleted_at disagree`), deleted_at and
--   updated_at are that event's commit time (`deleted_at is not the commit time of its event`,
--   `updated_at is not the commit time of its event`), seq is its seq (`seq is not the seq of its event`).
-- Scoped to the tables this run's change batch touched (macro changelake_touched_tables_predicate):
-- the folds wrote no other partition, and every event new to sequin_events is in the batch (its seq
-- is above both folds' positions). Whole tables with var changelake_full_tests (the nightly check),
-- after a full build of a fold, or in a `dbt test` that built nothing.
{%- set touched = changelake_touched_tables_predicate('scoped') %}
with

sequin_events as (

    select scoped.* from {{ ref('sequin_events') }} as scoped
    where ({{ touched }} or scoped.action = 'truncate')

),

consumer_records as (

    select scoped.* from {{ ref('consumer_records') }} as scoped
    where {{ touched }}

),

key_events as (

    {{ event_keys(
        'sequin_events',
        ['source', 'table_schema', 'table_name', 'commit_lsn', 'commit_index', 'commit_timestamp', 'seq']
    ) }}

),

-- Each key's last event: positions are unique, so the largest (position, time, seq) is that event's.
last_key_events as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        max(named_struct(
            'commit_lsn', commit_lsn,
            'commit_index', commit_index,
            'commit_timestamp', commit_timestamp,
            'seq', seq
        )) as last_event
    from key_events
    group by source, table_schema, table_name, record_pk

),

truncates as (

    select
        sequin_events.source,
        sequin_events.commit_lsn,
        sequin_events.commit_index,
        sequin_events.commit_timestamp,
        sequin_events.seq,
        truncated.truncated_table
    from sequin_events
        lateral view explode(sequin_events.truncated_tables) truncated as truncated_table
    where sequin_events.action = 'truncate'

),

compared as (

    select
        coalesce(last_key_events.source, consumer_records.source) as record_source,
        coalesce(last_key_events.table_schema, consumer_records.table_schema) as table_schema,
        coalesce(last_key_events.table_name, consumer_records.table_name) as table_name,
        coalesce(last_key_events.record_pk, consumer_records.record_pk) as record_pk,
        consumer_records.commit_lsn as record_commit_lsn,
        consumer_records.commit_index as record_commit_index,
        last_key_events.last_event.commit_lsn as last_event_lsn,
        last_key_events.last_event.commit_index as last_event_index,
        consumer_records.origin,
        consumer_records.deleted,
        consumer_records.deleted_at,
        consumer_records.updated_at,
        consumer_records.seq,
        truncates.source is not null as deleted_by_truncate,
        named_struct(
            'commit_lsn', consumer_records.commit_lsn,
            'commit_index', consumer_records.commit_index
        ) as record_position,
        named_struct(
            'commit_lsn', last_key_events.last_event.commit_lsn,
            'commit_index', last_key_events.last_event.commit_index
        ) as last_position,
        -- The event at the record's position, when its position is one allowed above: the truncate
        -- that deleted it, else its key's last event.
        case
            when truncates.source is not null then truncates.commit_timestamp
            else last_key_events.last_event.commit_timestamp
        end as event_commit_timestamp,
        case when truncates.source is not null then truncates.seq else last_key_events.last_event.seq end
            as event_seq
    from last_key_events
    full outer join consumer_records
        on
            last_key_events.source = consumer_records.source
            and last_key_events.table_schema = consumer_records.table_schema
            and last_key_events.table_name = consumer_records.table_name
            and last_key_events.record_pk = consumer_records.record_pk
    left join truncates
        on
            consumer_records.source = truncates.source
            and consumer_records.commit_lsn = truncates.commit_lsn
            and consumer_records.commit_index = truncates.commit_index
            and concat(consumer_records.table_schema, '.', consumer_records.table_name) = truncates.truncated_table

),

judged as (

    select
        record_source,
        table_schema,
        table_name,
        record_pk,
        record_commit_lsn,
        record_commit_index,
        last_event_lsn,
        last_event_index,
        case
            when origin is null then 'no record for a key with events'
            when last_event_lsn is null and origin = 'stream' then 'stream record without an event for its key'
            when last_event_lsn is null then null
            when record_position < last_position then 'record behind the last event for its key'
            when origin != 'stream' then null
            when record_position > last_position and not (deleted and deleted_by_truncate)
                then 'stream record past the last event for its key'
            when deleted != (deleted_at is not null) then 'deleted and deleted_at disagree'
            when deleted and deleted_at != event_commit_timestamp then 'deleted_at is not the commit time of its event'
            when updated_at != event_commit_timestamp then 'updated_at is not the commit time of its event'
            when seq != event_seq then 'seq is not the seq of its event'
        end as mismatch
    from compared

)

select * from judged
where mismatch is not null
