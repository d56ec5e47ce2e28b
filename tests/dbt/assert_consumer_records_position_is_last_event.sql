{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariant relates rows across models and runs, so a
-- violation can sit in rows this run did not write. A run that left every model it reads
-- unchanged skips it (skip_when_unchanged; var changelake_full_tests runs it anyway).
-- Invariants DESIGN §6 and §7.1 (a record is the state after the last event for its key): a
-- stream record's position is the last event for its key (its own changes, and a primary-key
-- change away from it), or a later truncate of its table that deleted it; a snapshot record's
-- position (its page's watermark) is never below the last event for its key; every key that has
-- an event has a record.
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
        'sequin_events', ['source', 'table_schema', 'table_name', 'commit_lsn', 'commit_index']
    ) }}

),

last_key_events as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        max(named_struct('commit_lsn', commit_lsn, 'commit_index', commit_index)) as last_position
    from key_events
    group by source, table_schema, table_name, record_pk

),

truncates as (

    select
        sequin_events.source,
        sequin_events.commit_lsn,
        sequin_events.commit_index,
        truncated.truncated_table
    from sequin_events
        lateral view explode(sequin_events.truncated_tables) truncated as truncated_table
    where sequin_events.action = 'truncate'

),

compared as (

    select
        last_key_events.source,
        last_key_events.table_schema,
        last_key_events.table_name,
        last_key_events.record_pk,
        last_key_events.last_position,
        consumer_records.record_pk is not null as has_record,
        named_struct(
            'commit_lsn', consumer_records.commit_lsn,
            'commit_index', consumer_records.commit_index
        ) as record_position,
        consumer_records.deleted,
        consumer_records.origin,
        truncates.source is not null as deleted_by_truncate
    from last_key_events
    left join consumer_records
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

)

select *
from compared
where
    not has_record
    or record_position < last_position
    or (record_position > last_position and origin = 'stream' and not (deleted and deleted_by_truncate))
