{% macro changelake_test_inputs_unchanged() %}
    {#-
        True when this run left every model the current test reads as the last run left it: each
        was skipped in this invocation (its skip_when held; changelake_skipped_model records it),
        so the test would read exactly what the last run's check read. Never with var
        changelake_full_tests, with changelake_skip_unchanged false, or when no node of this
        invocation read the positions (a plain `dbt test`); never for a test reading a model this
        invocation built or did not select. A test whose skip_when_unchanged names a condition
        (e.g. 'nothing_new') is skipped when that condition holds.
    -#}
    {%- set state = changelake_run_state(compute=false) -%}
    {%- if changelake_full_tests() or state is none or not var('changelake_skip_unchanged', true) -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set condition = config.get('skip_when_unchanged') -%}
    {%- if condition is string -%}
        {#- The test names the one condition under which what it checks cannot have changed. -#}
        {{ return(state.get(condition) is sameas true) }}
    {%- endif -%}
    {%- set models = model.depends_on.nodes | select('in', graph.nodes) | list -%}
    {%- if not models -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set skipped = graph.get('changelake_skipped_models') -%}
    {%- if not skipped or skipped.invocation_id != invocation_id -%}
        {{ return(false) }}
    {%- endif -%}
    {%- for unique_id in models -%}
        {%- if unique_id not in skipped.models -%}
            {{ return(false) }}
        {%- endif -%}
    {%- endfor -%}
    {{ return(true) }}
{% endmacro %}
