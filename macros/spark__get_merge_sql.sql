{% macro spark__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) %}
    {#- dbt-spark's merge has no sequence guard and no pruning: models that set `merge_guard` get
        guarded_merge_sql instead (merge_sql_with_guard). -#}
    {{- merge_sql_with_guard(
        dbt.spark__get_merge_sql, target, source, unique_key, dest_columns, incremental_predicates
    ) -}}
{% endmacro %}
