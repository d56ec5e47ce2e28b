{{ config(materialized='changelake_table', skip_when='bounds_loaded') }}

-- depends_on: {{ ref('sequin_events') }}
-- depends_on: {{ ref('snapshot_rows_placed') }}
-- depends_on: {{ ref('consumer_records') }}
-- depends_on: {{ ref('record_history') }}
-- depends_on: {{ ref('record_changes') }}

-- One row per source: the safe bound through which silver's incremental models have loaded
-- bronze, i.e. safe_bounds of the last run that built every one of them (built after them, so a
-- failed run records nothing). A run whose positions give no source a bound past this one, or
-- only over logical messages, has nothing to load (changelake_run_state): the models skipped
-- then (skip_when='nothing_new') start no Spark job. They are this table's loaders, found in the
-- graph rather than listed here; each must be a depends_on above (an error otherwise), so this
-- table is built after them. A run that selects only some of them leaves the table empty (nothing
-- known loaded), so the next full run loads: a loader left out would otherwise skip, forever, the
-- batch the others loaded.

{%- set loaded = namespace(all=true) %}
{%- if execute %}
    {%- for node in graph.nodes.values() %}
        {%- if node.resource_type == 'model' and node.config.get('skip_when') == 'nothing_new' %}
            {%- if node.unique_id not in model.depends_on.nodes %}
                {{ exceptions.raise_compiler_error(
                    "loaded_bounds: " ~ node.unique_id ~ " is skipped when nothing is new past the loaded "
                    ~ "safe bound, so loaded_bounds must be built after it: add `-- depends_on: {{ ref('"
                    ~ node.name ~ "') }}` to models/silver/loaded_bounds.sql"
                ) }}
            {%- endif %}
            {%- if node.unique_id not in selected_resources %}
                {%- set loaded.all = false %}
            {%- endif %}
        {%- endif %}
    {%- endfor %}
{%- endif %}

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
