{{ config(materialized='changelake_table', skip_when='bounds_loaded') }}

-- depends_on: {{ ref('sequin_events') }}
-- depends_on: {{ ref('snapshot_rows_placed') }}
-- depends_on: {{ ref('consumer_records') }}

-- One row per source: the safe bound through which silver's incremental models have loaded
-- bronze, i.e. safe_bounds of the last run that built sequin_events, snapshot_rows_placed and
-- consumer_records, all three (built after them, so a failed run records nothing). A run whose
-- positions give no source a bound past this one, or only over logical messages, has nothing to
-- load (changelake_run_state): its incremental models start no Spark job. A run that selects only
-- some of the three leaves the table empty (nothing known loaded), so the next full run loads.

{%- set loaders = [
    'model.changelake.sequin_events',
    'model.changelake.snapshot_rows_placed',
    'model.changelake.consumer_records',
] %}
{%- set loaded = namespace(all=true) %}
{%- for loader in loaders %}
    {%- if loader not in selected_resources %}
        {%- set loaded.all = false %}
    {%- endif %}
{%- endfor %}

with

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

final as (

    select
        source,
        safe_lsn as loaded_safe_lsn,
        positions_updated_at
    from safe_bounds
    {% if execute and not loaded.all %}
        where false
    {% endif %}

)

select * from final
