{{ config(skip_when_unchanged='nothing_new') }}
-- Fixed inputs: its result changes only with the code (checked by CI and the nightly full run), so a
-- run with nothing new skips it (skip_when_unchanged; var changelake_full_tests runs it anyway).
-- It runs after safe_bounds (depends_on below), which decides "nothing new" once for the
-- invocation; started before it, the test could not know and ran. It also names table_columns, a
-- model nothing in silver is built from: `dbt build` holds a model back for a test only when the
-- model descends from everything the test reads, so this check of the code runs beside the silver
-- chain instead of holding sequin_events and all after it (7 s of the chain's wall time on the
-- 100k-event batch of bench/silver_vs_merge_job.py).
-- depends_on: {{ ref('safe_bounds') }}, {{ ref('table_columns') }}
-- Macros event_keys and truncated_table_parts ("the keys an event touches", DESIGN §5 and §6, and
-- a truncate's tables): on fixed events an insert, update or delete touches its key, a primary-key
-- change touches its old key too, a truncate touches no key, and a truncated 'schema.table'
-- splits at the first dot. A row comes back per mismatch, naming the macro.
with

events as (

    select *
    from values
        (1, 'insert', '{"id":1}', cast(null as string), cast(null as array<string>)),
        (2, 'update', '{"id":2}', '{"id":1}', cast(null as array<string>)),
        (3, 'update', '{"id":2}', '{"id":2}', cast(null as array<string>)),
        (4, 'delete', '{"id":2}', cast(null as string), cast(null as array<string>)),
        (5, 'truncate', cast(null as string), cast(null as string), array('public.t', 'a.b.c'))
            as events (seq, action, record_pk, old_record_pk, truncated_tables)

),

touched_keys as (

    {{ event_keys('events', ['seq'], 'events.seq > 0') }}

),

expected_keys as (

    select *
    from values
        (1, '{"id":1}', false),
        (2, '{"id":2}', false),
        (2, '{"id":1}', true),
        (3, '{"id":2}', false),
        (4, '{"id":2}', false)
            as expected (seq, record_pk, is_old_key)

),

truncated as (

    select {{ truncated_table_parts('truncated.truncated_table') }}
    from events
        lateral view explode(events.truncated_tables) truncated as truncated_table

),

expected_truncated as (

    select *
    from values ('public', 't'), ('a', 'b.c') as expected (table_schema, table_name)

),

event_keys_extra as (

    select * from touched_keys
    except
    select * from expected_keys

),

event_keys_missing as (

    select * from expected_keys
    except
    select * from touched_keys

),

truncated_table_parts_extra as (

    select * from truncated
    except
    select * from expected_truncated

),

truncated_table_parts_missing as (

    select * from expected_truncated
    except
    select * from truncated

)

select
    'event_keys' as checked_macro,
    'extra' as mismatch,
    to_json(struct(*)) as mismatched_row
from event_keys_extra
union all
select
    'event_keys' as checked_macro,
    'missing' as mismatch,
    to_json(struct(*)) as mismatched_row
from event_keys_missing
union all
select
    'truncated_table_parts' as checked_macro,
    'extra' as mismatch,
    to_json(struct(*)) as mismatched_row
from truncated_table_parts_extra
union all
select
    'truncated_table_parts' as checked_macro,
    'missing' as mismatch,
    to_json(struct(*)) as mismatched_row
from truncated_table_parts_missing
