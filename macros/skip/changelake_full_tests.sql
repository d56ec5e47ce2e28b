{% macro changelake_full_tests() %}
    {#- Whether data tests check whole tables this run: var changelake_full_tests (nightly). -#}
    {{ return(var('changelake_full_tests', false) | string | lower in ['true', '1', 'yes']) }}
{% endmacro %}
