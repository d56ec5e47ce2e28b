{% macro sql_literal(value, data_type=none) %}
    {#-
        `value` (a string, number, boolean or none, as query_rows_at_execution returns them) as a
        Spark SQL literal: null for none, a quoted and escaped string for a string, the value
        itself otherwise; wrapped in cast(... as data_type) when data_type is given.
    -#}
    {%- if value is none -%}
        {%- set literal = 'null' -%}
    {%- elif value is string -%}
        {%- set literal = "'" ~ value | replace('\\', '\\\\') | replace("'", "\\'") ~ "'" -%}
    {%- elif value is sameas true or value is sameas false -%}
        {%- set literal = value | string | lower -%}
    {%- else -%}
        {%- set literal = value | string -%}
    {%- endif -%}
    {%- if data_type is none -%}
        {{ literal }}
    {%- else -%}
        cast({{ literal }} as {{ data_type }})
    {%- endif -%}
{%- endmacro %}
