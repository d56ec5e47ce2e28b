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
-- The scan-pruning macros behind sequin_events, snapshot_rows_placed and consumer_records
-- (source_ranges, source_ranges_predicate, partitions_predicate, rows_as_relation, sql_literal):
-- on fixed inputs each keeps exactly the rows it should. Models only meet their literal path in
-- real incremental runs (unit tests take the plain joins), so this pins it without one. A row
-- comes back per mismatch, naming the macro.
{%- set ranges = source_ranges(
    [{'source': 'a', 'safe_lsn': 100}, {'source': 'b', 'safe_lsn': 200}],
    'safe_lsn',
    [{'source': 'a', 'max_commit_lsn': 10}, {'source': 'gone', 'max_commit_lsn': 5}],
    'max_commit_lsn',
) %}
with

candidates as (

    select *
    from values
        ('a', 9),
        ('a', 10),
        ('a', 100),
        ('a', 101),
        ('b', 1),
        ('b', 200),
        ('b', 201),
        ('c', 50),
        (null, 50)
            as candidates (source, position)

),

-- Ranges: a in [10, 100] (bounds inclusive), b below its bound only (no stored row), c unlisted.
kept_by_ranges as (

    select
        candidates.source,
        candidates.position
    from candidates
    where {{ source_ranges_predicate('candidates', 'position', ranges) }}

),

expected_by_ranges as (

    select *
    from values ('a', 10), ('a', 100), ('b', 1), ('b', 200) as expected (source, position)

),

-- Partitions: a and the null source; no partitions at all keeps nothing.
kept_by_partitions as (

    select
        candidates.source,
        candidates.position
    from candidates
    where
        {{ partitions_predicate('candidates', ['source'], [{'source': 'a'}, {}]) }}
        or {{ partitions_predicate('candidates', ['source'], []) }}

),

expected_by_partitions as (

    select *
    from values ('a', 9), ('a', 10), ('a', 100), ('a', 101), (null, 50) as expected (source, position)

),

-- Rows as literals (a missing value is null; no rows is an empty relation; none is the fallback).
relation_rows as (

    {{ rows_as_relation(
        [{'source': 'a', 'max_seq': 3}, {'source': "it's"}],
        [['source', 'string'], ['max_seq', 'bigint']],
        'select 1',
    ) }}
    union all
    {{ rows_as_relation([], [['source', 'string'], ['max_seq', 'bigint']], 'select 1') }}
    union all
    {{ rows_as_relation(none, [], "select 'fallback' as source, cast(7 as bigint) as max_seq") }}

),

expected_relation_rows as (

    select *
    from values
        ('a', cast(3 as bigint)),
        (concat('it', chr(39), 's'), cast(null as bigint)),
        ('fallback', cast(7 as bigint))
            as expected (source, max_seq)

),

source_ranges_predicate_extra as (

    select * from kept_by_ranges
    except
    select * from expected_by_ranges

),

source_ranges_predicate_missing as (

    select * from expected_by_ranges
    except
    select * from kept_by_ranges

),

partitions_predicate_extra as (

    select * from kept_by_partitions
    except
    select * from expected_by_partitions

),

partitions_predicate_missing as (

    select * from expected_by_partitions
    except
    select * from kept_by_partitions

),

rows_as_relation_extra as (

    select * from relation_rows
    except
    select * from expected_relation_rows

),

rows_as_relation_missing as (

    select * from expected_relation_rows
    except
    select * from relation_rows

),

literal_checks as (

    select
        {{ sql_literal("it's a\\b") }} as rendered,
        concat('it', chr(39), 's a', chr(92), 'b') as expected

),

sql_literal_mismatches as (

    select
        rendered,
        expected
    from literal_checks
    where rendered != expected

)

select
    'source_ranges_predicate' as checked_macro,
    'extra' as mismatch,
    to_json(struct(*)) as mismatched_row
from source_ranges_predicate_extra
union all
select
    'source_ranges_predicate' as checked_macro,
    'missing' as mismatch,
    to_json(struct(*)) as mismatched_row
from source_ranges_predicate_missing
union all
select
    'partitions_predicate' as checked_macro,
    'extra' as mismatch,
    to_json(struct(*)) as mismatched_row
from partitions_predicate_extra
union all
select
    'partitions_predicate' as checked_macro,
    'missing' as mismatch,
    to_json(struct(*)) as mismatched_row
from partitions_predicate_missing
union all
select
    'rows_as_relation' as checked_macro,
    'extra' as mismatch,
    to_json(struct(*)) as mismatched_row
from rows_as_relation_extra
union all
select
    'rows_as_relation' as checked_macro,
    'missing' as mismatch,
    to_json(struct(*)) as mismatched_row
from rows_as_relation_missing
union all
select
    'sql_literal' as checked_macro,
    'different' as mismatch,
    to_json(struct(*)) as mismatched_row
from sql_literal_mismatches
