{% macro databricks__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) %}
    {#-
        On dbt-databricks, adapter dispatch looks for databricks__get_merge_sql in every package
        before it looks for spark__get_merge_sql, so the adapter's own merge would win over this
        project's spark__get_merge_sql and silently drop the position guard. This root-project
        macro is found first and routes like spark__get_merge_sql (merge_sql_with_guard, called
        qualified for the same reason).
    -#}
    {{- changelake.merge_sql_with_guard(
        dbt.databricks__get_merge_sql, target, source, unique_key, dest_columns, incremental_predicates
    ) -}}
{% endmacro %}
