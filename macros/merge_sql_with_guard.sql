{% macro merge_sql_with_guard(adapter_merge_sql, target, source, unique_key, dest_columns, incremental_predicates) %}
    {#-
        This project's merge on every Spark adapter: a model that sets `merge_guard` (columns
        compared as one tuple, e.g. ['commit_lsn', 'commit_index']) gets guarded_merge_sql; every
        other merge model keeps the adapter's own SQL (adapter_merge_sql, e.g.
        dbt.spark__get_merge_sql). spark__get_merge_sql and databricks__get_merge_sql call it.
    -#}
    {%- if config.get('merge_guard') -%}
        {{ guarded_merge_sql(
            target, source, unique_key,
            config.get('merge_guard'), config.get('merge_prune_by', []), incremental_predicates
        ) }}
    {%- else -%}
        {{ adapter_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) }}
    {%- endif -%}
{% endmacro %}
