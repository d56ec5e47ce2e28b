{% macro spark__get_merge_sql(target, source, unique_key, dest_columns, incremental_predicates) %}
    {#- dbt-spark's merge has no sequence guard and no pruning: models that set `merge_guard` get
        guarded_merge_sql instead (merge_sql_with_guard). Called as changelake.<macro>: where
        changelake is a package, the host's `dispatch:` config brings this macro to the host's own
        merge models too, whose project is where an unqualified name would be looked up. -#}
    {{- changelake.merge_sql_with_guard(
        dbt.spark__get_merge_sql, target, source, unique_key, dest_columns, incremental_predicates
    ) -}}
{% endmacro %}
