{% macro spark_identifier(name) %}
    {#- `name` as a Spark SQL identifier: in backticks, a backtick inside doubled (review S1). -#}
    {{- '`' ~ name | replace('`', '``') ~ '`' -}}
{%- endmacro %}
