{% macro changelake_stored_positions(relation, query) %}
    {#-
        What a user's incremental model already holds, for changes_since / records_changed_since:
        none when `relation` does not exist yet or is being rebuilt (--full-refresh of `this`):
        read everything; otherwise {'rows': the rows of `query` over it, or none at parse time and
        in dbt unit tests, where the query itself is used}.
    -#}
    {%- if not execute -%}
        {{ return({'rows': none}) }}
    {%- endif -%}
    {%- set existing = adapter.get_relation(
        database=relation.database, schema=relation.schema, identifier=relation.identifier) -%}
    {%- if existing is none or (relation.render() == this.render() and should_full_refresh()) -%}
        {{ return(none) }}
    {%- endif -%}
    {{ return({'rows': changelake.query_rows_at_execution(query)}) }}
{% endmacro %}
