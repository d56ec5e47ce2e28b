{{ config(skip_when_unchanged=true, full_check_only=true) }}
-- A check of the as_of macro on whole tables: the nightly full check (var changelake_full_tests), after a full
-- build of a fold, and a `dbt test` that built nothing run it; a batch build passes it without a query
-- (full_check_only, macro spark__get_test_sql). What a batch can break here is checked every run by
-- assert_record_history_is_the_timeline_of_consumer_records (record_history's current versions are
-- the live consumer_records rows, and each key's versions chain without gap or overlap), on the tables
-- the batch touched; as_of's answer from such a history is the macro's code, which a batch does not
-- change. It cost 16.7 s of a 100k-event build over 1M events.
-- The as_of macro at the present (a far-future timestamp, and each source's last position as an
-- LSN) gives exactly the live consumer_records rows (DESIGN §6 history: a consistent state of a
-- whole source at one position). tests/integration/test_dbt_flow.py checks an earlier position.
{#- Each source's last position, looked up when the test runs (not at parse time, and not before
    record_history exists, e.g. a `dbt compile` or sqlfluff on a fresh warehouse). -#}
{#- Not on a run that skips the test (its query is then a constant). -#}
{#- Whole tables whenever it runs (changelake_touched_tables_predicate is `true` then). -#}
{%- set history_exists = execute and not changelake_test_inputs_unchanged()
    and changelake_touched_tables_predicate('scoped') == 'true'
    and load_relation(ref('record_history')) is not none -%}
{%- set last_positions = query_rows_at_execution(
    'select source, max(commit_lsn) as max_lsn from ' ~ ref('record_history') ~ ' group by source'
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
    where not scoped.deleted

),

as_of_now as (

    select
        scoped.source,
        scoped.table_schema,
        scoped.table_name,
        scoped.record_pk,
        scoped.record
    from ({{ as_of(ref('record_history'), '9999-12-31 00:00:00') }}) as scoped

),

as_of_last_positions as (

    {% for position in (last_positions or []) %}
        select
            scoped.source,
            scoped.table_schema,
            scoped.table_name,
            scoped.record_pk,
            scoped.record
        from ({{ as_of(ref('record_history'), position.max_lsn, source=position.source) }}) as scoped
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
