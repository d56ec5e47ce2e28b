{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariant relates versions across runs (and models). A run
-- that left every model it reads unchanged skips it (var changelake_full_tests runs it anyway).
-- record_history's versions of a record form a timeline (DESIGN §6, §8 history): each starts
-- before it ends (position order), is current exactly when it has no end, only the last one may be
-- open, and none starts before the previous one ended (no overlap).
-- Scoped to the tables this run's change batch touched (macro changelake_touched_tables_predicate):
-- the folds wrote no other partition, and every event new to sequin_events is in the batch (its seq
-- is above both folds' positions). Whole tables with var changelake_full_tests (the nightly check),
-- after a full build of a fold, or in a `dbt test` that built nothing.
{%- set touched = changelake_touched_tables_predicate('scoped') %}
with

record_history as (

    select scoped.* from {{ ref('record_history') }} as scoped
    where {{ touched }}

),

ordered as (

    select
        *,
        lead(valid_from_lsn) over records as next_valid_from_lsn,
        lead(valid_from_index) over records as next_valid_from_index
    from record_history
    window records as (
        partition by source, table_schema, table_name, record_pk
        order by valid_from_lsn, valid_from_index
    )

)

select
    source,
    table_schema,
    table_name,
    record_pk,
    valid_from_lsn,
    valid_from_index
from ordered
where
    is_current != (valid_to_lsn is null)
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
