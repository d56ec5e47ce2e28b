{% macro change_log_ctes(change_batch, bounds, incremental, empty=false) %}
{#-
    CTEs ending in `record_changes`: the change-log rows (macro record_change_rows' columns) a
    model folds or writes. With `change_batch` (macro changelake_reads_change_batch) they are the
    rows of model record_changes above the fold's stored positions (bounds.batch_filter). Without
    it they are derived here from sequin_events and snapshot_rows_placed (macro new_changes):
    above the positions of `bounds` when `incremental`, else every row, or none with `empty` (model
    record_changes when no fold reads it). The folds and model record_changes share it.
-#}
{%- if change_batch is not none %}
record_changes as (

    -- The run's change log (model record_changes), above this model's stored positions.
    select * from {{ change_batch.relation }} as change_batch
    where {{ bounds.batch_filter }}

)
{%- else %}
sequin_events as (

    select * from {{ ref('sequin_events') }}
    {% if empty %}
        where false
    {% endif %}

),

snapshot_rows_placed as (

    select * from {{ ref('snapshot_rows_placed') }}
    {% if empty %}
        where false
    {% endif %}

),

{% if incremental %}
    stored_positions as (

        -- An event that changed nothing (e.g. a truncate of an empty table) is simply folded
        -- again next run, which changes nothing. Snapshot rows above max_commit_lsn are folded
        -- (again: idempotently) now; those at or below it were placed before the run that
        -- stored it.
        {{ rows_as_relation(bounds.stored_rows, [
            ['source', 'string'],
            ['max_seq', 'bigint'],
            ['max_commit_lsn', 'bigint'],
        ], bounds.stored_positions_query) }}

    ),
{% endif %}

{{ new_changes(bounds, incremental) }},

record_changes as (

    {{ record_change_rows('new_events', 'new_snapshot_rows') }}

)
{%- endif %}
{%- endmacro %}
