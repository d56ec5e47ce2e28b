{% macro rows_as_relation(rows, columns, fallback_query) %}
    {#-
        A SELECT yielding `rows` (from query_rows_at_execution) as typed literals; `columns` is a
        list of [name, spark type] pairs. No rows gives an empty relation of the same shape. When
        rows is none (parse time, dbt unit tests) the fallback_query itself is returned, so a model
        has one shape whichever way the values arrive.
    -#}
    {%- if rows is none -%}
        {{ return(fallback_query) }}
    {%- endif -%}
    {%- set selects = [] -%}
    {%- for row in (rows if rows else [{}]) -%}
        {%- set items = [] -%}
        {%- for column in columns -%}
            {%- do items.append(changelake.sql_literal(row.get(column[0]), column[1]) ~ ' as ' ~ column[0]) -%}
        {%- endfor -%}
        {%- do selects.append('select ' ~ items | join(', ') ~ ('' if rows else ' where false')) -%}
    {%- endfor -%}
    {{ return(selects | join('\n        union all\n        ')) }}
{% endmacro %}
