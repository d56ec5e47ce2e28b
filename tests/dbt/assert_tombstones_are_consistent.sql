{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariant relates rows across models and runs, so a
-- violation can sit in rows this run did not write. A run that left every model it reads
-- unchanged skips it (skip_when_unchanged; var changelake_full_tests runs it anyway).
-- Invariant DESIGN §6 (deletes are soft: deleted = true, deleted_at and the deleting event's
-- position): deleted and deleted_at agree, and deleted_at is the commit time of the event at the
-- record's position.
-- Scoped to the tables this run's change batch touched (macro changelake_touched_tables_predicate):
-- the folds wrote no other partition, and every event new to sequin_events is in the batch (its seq
-- is above both folds' positions). Whole tables with var changelake_full_tests (the nightly check),
-- after a full build of a fold, or in a `dbt test` that built nothing.
{%- set touched = changelake_touched_tables_predicate('scoped') %}
with

consumer_records as (

    select scoped.* from {{ ref('consumer_records') }} as scoped
    where
        {{ touched }}
        and scoped.origin = 'stream'

),

sequin_events as (

    select scoped.* from {{ ref('sequin_events') }} as scoped
    where ({{ touched }} or scoped.action = 'truncate')

)

select
    consumer_records.source,
    consumer_records.table_schema,
    consumer_records.table_name,
    consumer_records.record_pk,
    consumer_records.commit_lsn,
    consumer_records.commit_index
from consumer_records
left join sequin_events
    on
        consumer_records.source = sequin_events.source
        and consumer_records.commit_lsn = sequin_events.commit_lsn
        and consumer_records.commit_index = sequin_events.commit_index
where
    sequin_events.source is null
    or consumer_records.deleted != (consumer_records.deleted_at is not null)
    or (consumer_records.deleted and consumer_records.deleted_at != sequin_events.commit_timestamp)
    or consumer_records.updated_at != sequin_events.commit_timestamp
    or consumer_records.seq != sequin_events.seq
