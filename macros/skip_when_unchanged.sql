{% macro changelake_skip_reason() %}
    {#-
        Why this model need not run, or none. A model opts in with the config `skip_when`:
        - 'nothing_new': the run finds no source's safe bound past what silver loaded
          (changelake_run_state().nothing_new): the incremental silver models would add nothing;
        - 'positions_unchanged': bronze.stream_positions holds what the last run built from: the
          models computed from positions and relation shapes would be rewritten unchanged;
        - 'bounds_loaded': every source's safe bound is the one silver loaded through
          (loaded_bounds would be rewritten unchanged).
        Never skipped: a model whose table does not exist yet, a --full-refresh, a model without
        the config, or a var changelake_skip_unchanged set to false.
    -#}
    {%- set skip_when = config.get('skip_when') -%}
    {%- if skip_when is none or not var('changelake_skip_unchanged', true) -%}
        {{ return(none) }}
    {%- endif -%}
    {%- if skip_when not in ['nothing_new', 'positions_unchanged', 'bounds_loaded'] -%}
        {%- do exceptions.raise_compiler_error(
            "skip_when must be 'nothing_new', 'positions_unchanged' or 'bounds_loaded', got '"
            ~ skip_when ~ "'") -%}
    {%- endif -%}
    {%- if should_full_refresh() or load_cached_relation(this) is none -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set state = changelake_run_state() -%}
    {%- if state is not none and state[skip_when] -%}
        {{ return({
            'nothing_new': 'skipped: nothing new past the loaded safe bound',
            'positions_unchanged': 'skipped: positions unchanged',
            'bounds_loaded': 'skipped: bounds already loaded',
        }[skip_when]) }}
    {%- endif -%}
    {{ return(none) }}
{% endmacro %}


{% macro changelake_skipped_model(reason) %}
    {#- A materialization's result for a model that runs no statement: dbt records `reason`. -#}
    {%- call noop_statement('main', reason) -%}
        -- {{ reason }}
    {%- endcall -%}
    {{ return({'relations': [this]}) }}
{% endmacro %}


{#-
    dbt-spark's own materializations, preceded by changelake_skip_reason: a model configured with
    skip_when runs no statement (and its compiled SQL ran no lookup) when the run finds nothing it
    would change.
-#}
{% materialization incremental, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set reason = changelake_skip_reason() -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {{ return(dbt.materialization_incremental_spark()) }}
{%- endmaterialization %}


{% materialization table, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set reason = changelake_skip_reason() -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {{ return(dbt.materialization_table_spark()) }}
{%- endmaterialization %}
