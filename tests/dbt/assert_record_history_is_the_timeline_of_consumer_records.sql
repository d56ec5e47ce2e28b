{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariants relate versions across runs (and models). A run
-- that left every model it reads unchanged skips it (var changelake_full_tests runs it anyway).
-- record_history's invariants (DESIGN §6, §8 history) in one test, one window over each key's versions
-- (one Spark job instead of three; each failing row names what it breaks, `mismatch`):
-- - the versions of a record form a timeline: each starts before it ends (position order), is
--   current exactly when it has no end, only the last one may be open, none starts before the
--   previous one ended (no overlap), and its position is its end, or its start while open
--   (`versions do not follow each other`); a record has at most one current version (`more than
--   one current version`);
-- - its current versions are consumer_records' live rows (same record, position, seq, origin,
--   commit time and re-read flag) and a deleted record has no current version (`current version
--   differs from the live consumer_records row`);
-- - the last version of a deleted record ends by a delete, truncate or absence at or before its
--   tombstone (`last version does not end at the tombstone`).
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

-- Each version beside its key's next one, and how many current versions its key has.
versions as (

    select
        scoped.*,
        lead(scoped.valid_from_lsn) over key_versions as next_valid_from_lsn,
        lead(scoped.valid_from_index) over key_versions as next_valid_from_index,
        sum(case when scoped.is_current then 1 else 0 end) over (
            partition by scoped.source, scoped.table_schema, scoped.table_name, scoped.record_pk
        ) as current_versions_of_record
    from {{ ref('record_history') }} as scoped
    where {{ touched }}
    window key_versions as (
        partition by scoped.source, scoped.table_schema, scoped.table_name, scoped.record_pk
        order by scoped.valid_from_lsn, scoped.valid_from_index
    )

),

timeline_breaks as (

    select
        source as record_source,
        table_schema,
        table_name,
        record_pk,
        valid_from_lsn,
        valid_from_index,
        case
            when current_versions_of_record > 1 then 'more than one current version'
            else 'versions do not follow each other'
        end as mismatch
    from versions
    where
        current_versions_of_record > 1
        or is_current != (valid_to_lsn is null)
        or (valid_to_lsn is null) != (valid_to_index is null)
        or (valid_to_lsn is null) != (ended_by is null)
        or (valid_to_lsn is null) != (valid_to is null)
        or valid_to_lsn < valid_from_lsn
        or (valid_to_lsn = valid_from_lsn and valid_to_index <= valid_from_index)
        or (next_valid_from_lsn is not null and valid_to_lsn is null)
        or next_valid_from_lsn < valid_to_lsn
        or (next_valid_from_lsn = valid_to_lsn and next_valid_from_index < valid_to_index)
        or commit_lsn != coalesce(valid_to_lsn, valid_from_lsn)
        or commit_index != coalesce(valid_to_index, valid_from_index)

),

live_records as (

    select * from consumer_records
    where not deleted

),

current_versions as (

    select * from versions
    where is_current

),

-- The last version of each record: the one with no next (the timeline check above holds the
-- order; a duplicate start is the rules test's unique key).
last_versions as (

    select * from versions
    where next_valid_from_lsn is null

),

live_mismatches as (

    select
        coalesce(live_records.source, current_versions.source) as record_source,
        coalesce(live_records.table_schema, current_versions.table_schema) as table_schema,
        coalesce(live_records.table_name, current_versions.table_name) as table_name,
        coalesce(live_records.record_pk, current_versions.record_pk) as record_pk,
        current_versions.valid_from_lsn,
        current_versions.valid_from_index,
        'current version differs from the live consumer_records row' as mismatch
    from live_records
    full outer join current_versions
        on
            live_records.source = current_versions.source
            and live_records.table_schema = current_versions.table_schema
            and live_records.table_name = current_versions.table_name
            and live_records.record_pk = current_versions.record_pk
    where
        live_records.source is null
        or current_versions.source is null
        or live_records.record is distinct from current_versions.record
        or live_records.commit_lsn != current_versions.valid_from_lsn
        or live_records.commit_index != current_versions.valid_from_index
        or live_records.seq is distinct from current_versions.valid_from_seq
        or live_records.origin != current_versions.origin
        or live_records.updated_at != current_versions.valid_from
        or live_records.needs_reread != current_versions.needs_reread

),

tombstone_mismatches as (

    select
        consumer_records.source as record_source,
        consumer_records.table_schema,
        consumer_records.table_name,
        consumer_records.record_pk,
        last_versions.valid_from_lsn,
        last_versions.valid_from_index,
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

select * from timeline_breaks
union all
select * from live_mismatches
union all
select * from tombstone_mismatches
