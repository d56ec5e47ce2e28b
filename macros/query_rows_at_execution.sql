{% macro query_rows_at_execution(query) %}
    {#-
        The rows of `query` as a list of dicts (column name -> value; a NULL value is absent, so
        read it with .get()), or none when the query must not run: at parse time (execute is
        false) and in a dbt unit test, whose refs and `this` are fixture CTEs rather than tables.
        Each row travels as one JSON string, so agate never re-types a value (a source named
        '2024' stays a string, a bigint stays exact).
        Models use it to turn small lookups (stored max positions, safe bounds, the batch's
        partitions) into literals before their main query is planned: a literal predicate lets
        Delta skip files and partitions, a join against the same values does not.
    -#}
    {%- if not execute or model.resource_type == 'unit_test' -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set result = run_query(
        'select to_json(struct(*)) as row_json from (' ~ query ~ ') as query_rows') -%}
    {%- set rows = [] -%}
    {%- for row in result.rows -%}
        {%- do rows.append(fromjson(row[0])) -%}
    {%- endfor -%}
    {{ return(rows) }}
{% endmacro %}
