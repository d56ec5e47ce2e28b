{% macro json_text_to_spark_type(value, spark_type) %}
    {#-
        Cast one value of a record parsed as map<string, string> (JSON scalars as their text) to
        spark_type. Postgres timestamptz text ends in a +hh offset, which Spark reads only as +hh:mm.
    -#}
    {%- if spark_type == 'string' -%}
        {{ value }}
    {%- elif spark_type == 'timestamp' -%}
        cast(regexp_replace({{ value }}, '([+-][0-9]{2})$', '$1:00') as timestamp)
    {%- else -%}
        cast({{ value }} as {{ spark_type }})
    {%- endif -%}
{%- endmacro %}
