{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariant relates versions across runs (and models). A run
-- that left every model it reads unchanged skips it (var changelake_full_tests runs it anyway).
-- Invariant DESIGN §6 for record_history: its current versions are consumer_records' live rows (same
-- record, position, seq, origin, commit time and re-read flag), a deleted record has no current
-- version, and the last version of a deleted record ends by a delete or truncate at or before its
-- tombstone.
-- Scoped to the tables this run's change batch touched (macro changelake_touched_tables_predicate):
-- the folds wrote no other partition, and every event new to sequin_events is in the batch (its seq
-- is above both folds' positions). Whole tables with var changelake_full_tests (the nightly check),
-- after a full build of a fold, or in a `dbt test` that built nothing.
{%- set touched = changelake_touched_tables_predicate('scoped') %}
with

consumer_records as (

    select scoped.* from {{ ref('consumer_records') }} as scoped
    where {{ touched }}

),

record_history as (

    select scoped.* from {{ ref('record_history') }} as scoped
    where {{ touched }}

),

live_records as (

    select * from consumer_records
    where not deleted

),

current_versions as (

    select * from record_history
    where is_current

),

last_versions as (

    select *
    from record_history
    qualify
        row_number() over (
            partition by source, table_schema, table_name, record_pk
            order by valid_from_lsn desc, valid_from_index desc
        ) = 1

),

live_mismatches as (

    select
        coalesce(consumer_records.source, current_versions.source) as record_source,
        coalesce(consumer_records.table_schema, current_versions.table_schema) as table_schema,
        coalesce(consumer_records.table_name, current_versions.table_name) as table_name,
        coalesce(consumer_records.record_pk, current_versions.record_pk) as record_pk,
        'current version differs from the live consumer_records row' as mismatch
    from live_records as consumer_records
    full outer join current_versions
        on
            consumer_records.source = current_versions.source
            and consumer_records.table_schema = current_versions.table_schema
            and consumer_records.table_name = current_versions.table_name
            and consumer_records.record_pk = current_versions.record_pk
    where
        consumer_records.source is null
        or current_versions.source is null
        or consumer_records.record is distinct from current_versions.record
        or consumer_records.commit_lsn != current_versions.valid_from_lsn
        or consumer_records.commit_index != current_versions.valid_from_index
        or consumer_records.seq is distinct from current_versions.valid_from_seq
        or consumer_records.origin != current_versions.origin
        or consumer_records.updated_at != current_versions.valid_from
        or consumer_records.needs_reread != current_versions.needs_reread

),

tombstone_mismatches as (

    select
        consumer_records.source as record_source,
        consumer_records.table_schema,
        consumer_records.table_name,
        consumer_records.record_pk,
        'last version does not end at the tombstone' as mismatch
    from consumer_records
    inner join last_versions
        on
            consumer_records.source = last_versions.source
            and consumer_records.table_schema = last_versions.table_schema
            and consumer_records.table_name = last_versions.table_name
            and consumer_records.record_pk = last_versions.record_pk
    where
        consumer_records.deleted
        and (
            last_versions.is_current
            or last_versions.ended_by not in ('delete', 'truncate', 'absent')
            -- At or before the tombstone: a later delete of the deleted key (synthetic data, e.g.
            -- bench/) moves consumer_records' tombstone but ends no version.
            or last_versions.valid_to_lsn > consumer_records.commit_lsn
            or (
                last_versions.valid_to_lsn = consumer_records.commit_lsn
                and last_versions.valid_to_index > consumer_records.commit_index
            )
        )

)

select * from live_mismatches
union all
select * from tombstone_mismatches
