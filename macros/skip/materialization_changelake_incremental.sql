{#-
    dbt-spark's own materializations, preceded by changelake_skip_reason: a model configured with
    skip_when runs no statement (and its compiled SQL ran no lookup) when the run finds nothing it
    would change. They have names of their own rather than overriding `incremental` and `table`:
    dbt ignores an installed package's override of a built-in materialization, so the same
    materializations work where changelake is the root project and where it is a package of
    another project. is_incremental (macros/is_incremental.sql) counts changelake_incremental.
-#}
{% materialization changelake_incremental, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set input_versions = changelake_input_versions() -%}
    {%- set reason = changelake_skip_reason(input_versions) -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {%- set result = dbt.materialization_incremental_spark() -%}
    {%- do changelake_store_input_versions(input_versions) -%}
    {%- do changelake_report_completeness() -%}
    {{ return(result) }}
{%- endmaterialization %}
