{% macro is_incremental() %}
    {#-
        dbt's is_incremental, true for the changelake_incremental materialization too (dbt's own
        answers only for `incremental`): an existing table, not a --full-refresh. The models of
        this project call it unqualified, so where changelake is the root project or a package,
        this macro is the one their SQL finds (a node's own package comes first).
    -#}
    {%- if not execute -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set relation = adapter.get_relation(this.database, this.schema, this.table) -%}
    {{ return(relation is not none
        and relation.type == 'table'
        and model.config.materialized in ['incremental', 'changelake_incremental']
        and not should_full_refresh()) }}
{% endmacro %}
