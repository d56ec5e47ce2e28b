{% macro spark__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) %}
    {#-
        dbt-spark's merge has no sequence guard and no pruning. A model that sets `merge_guard`
        (columns compared as one tuple, e.g. ['commit_lsn', 'commit_index']) gets guarded_merge_sql;
        every other merge model keeps dbt-spark's own SQL.
    -#}
    {%- if config.get('merge_guard') -%}
        {{ guarded_merge_sql(
            target, source, unique_key,
            config.get('merge_guard'), config.get('merge_prune_by', []), incremental_predicates
        ) }}
    {%- else -%}
        {{ dbt.spark__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) }}
    {%- endif -%}
{% endmacro %}
