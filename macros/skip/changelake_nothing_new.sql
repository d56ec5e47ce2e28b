{% macro changelake_nothing_new() %}
    {#- True when this run finds nothing past the safe bound silver loaded (changelake_run_state). -#}
    {%- set state = changelake_run_state() -%}
    {{ return(state is not none and state.nothing_new) }}
{% endmacro %}
