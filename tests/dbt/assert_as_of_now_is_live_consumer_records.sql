{{ config(skip_when_unchanged=true) }}
-- The touched tables whole, not this run's rows: the invariant relates versions across runs (and models). A run
-- that left every model it reads unchanged skips it (var changelake_full_tests runs it anyway).
-- The as_of macro at the present (a far-future timestamp, and each source's last position as an
-- LSN) gives exactly the live consumer_records rows (DESIGN §6 history: a consistent state of a
-- whole source at one position). tests/integration/test_dbt_flow.py checks an earlier position.
{#- Each source's last position, looked up when the test runs (not at parse time, and not before
    record_history exists, e.g. a `dbt compile` or sqlfluff on a fresh warehouse). -#}
{#- Not on a run that skips the test (its query is then a constant). -#}
{#- Scoped to the tables this run's change batch touched (macro changelake_touched_tables_predicate):
    the folds wrote no other partition. Whole tables with var changelake_full_tests (the nightly
    check), after a full build of a fold, or in a `dbt test` that built nothing. The lookup of the
    last positions is scoped too (it reads only those tables' partitions): as of the last position
    of a source's touched tables, no version of theirs is later, so their state there is the live
    one, as at the source's last position. as_of reads those tables' versions only (touched_history): its
    timestamp cut is then the touched tables' last change, which by the same argument gives their live
    state; given the whole of record_history, the cut's aggregate read every version of every table
    before the filter applied (18 s of a 100k-event build over 1M events of history). -#}
{%- set touched = changelake_touched_tables_predicate('scoped') -%}
{%- set touched_history = '(select * from ' ~ ref('record_history') ~ ' as scoped where ' ~ touched
    ~ ') as touched_history' -%}
{%- set history_exists = execute and not changelake_test_inputs_unchanged()
    and load_relation(ref('record_history')) is not none -%}
{%- set last_positions = query_rows_at_execution(
    'select scoped.source, max(scoped.commit_lsn) as max_lsn from ' ~ ref('record_history')
    ~ ' as scoped where ' ~ touched ~ ' group by scoped.source'
) if history_exists else none %}
with

live_records as (

    select
        scoped.source,
        scoped.table_schema,
        scoped.table_name,
        scoped.record_pk,
        scoped.record
    from {{ ref('consumer_records') }} as scoped
    where
        not scoped.deleted
        and {{ touched }}

),

as_of_now as (

    select
        scoped.source,
        scoped.table_schema,
        scoped.table_name,
        scoped.record_pk,
        scoped.record
    from ({{ as_of(touched_history, '9999-12-31 00:00:00') }}) as scoped
    where {{ touched }}

),

as_of_last_positions as (

    {% for position in (last_positions or []) %}
        select
            scoped.source,
            scoped.table_schema,
            scoped.table_name,
            scoped.record_pk,
            scoped.record
        from ({{ as_of(touched_history, position.max_lsn, source=position.source) }}) as scoped
        where {{ touched }}
        union all
    {% endfor %}
    select * from live_records
    where {{ 'true' if last_positions is none else 'false' }}

),

-- One aggregation instead of an EXCEPT ALL per direction and mode: each live consumer_records row
-- counts +1 in both modes, each row an as_of gives -1 in its mode; a group whose sum is not 0 is a
-- difference (surplus > 0: live but missing from as_of; < 0: an as_of row not live, or one too many).
signed_rows as (

    select
        live_records.source,
        live_records.table_schema,
        live_records.table_name,
        live_records.record_pk,
        live_records.record,
        modes.check_mode,
        1 as side
    from live_records
        lateral view explode(array('timestamp', 'lsn')) modes as check_mode
    union all
    select
        source,
        table_schema,
        table_name,
        record_pk,
        record,
        'timestamp' as check_mode,
        -1 as side
    from as_of_now
    union all
    select
        source,
        table_schema,
        table_name,
        record_pk,
        record,
        'lsn' as check_mode,
        -1 as side
    from as_of_last_positions

),

differences as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        record,
        check_mode,
        sum(side) as surplus
    from signed_rows
    group by source, table_schema, table_name, record_pk, record, check_mode
    having sum(side) != 0

)

select
    source,
    table_schema,
    table_name,
    record_pk,
    record,
    check_mode,
    surplus
from differences
