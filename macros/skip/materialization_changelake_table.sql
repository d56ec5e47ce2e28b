{#- For tables, like changelake_incremental (materialization_changelake_incremental.sql, which says why). -#}
{% materialization changelake_table, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set input_versions = changelake_input_versions() -%}
    {%- set reason = changelake_skip_reason(input_versions) -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {%- set result = dbt.materialization_table_spark() -%}
    {%- do changelake_store_input_versions(input_versions) -%}
    {{ return(result) }}
{%- endmaterialization %}
