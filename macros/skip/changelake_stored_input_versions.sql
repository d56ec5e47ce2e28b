{% macro changelake_stored_input_versions() %}
    {#- What changelake_store_input_versions stored on `this` after its last run (none: nothing). -#}
    {%- set rows = run_query("show tblproperties " ~ this ~ " ('changelake.input_versions')").rows -%}
    {%- set value = rows[0][1] if rows | length == 1 and rows[0][0] == 'changelake.input_versions' else none -%}
    {{ return(value) }}
{% endmacro %}
