{% macro json_text_to_spark_type(value, spark_type) %}
    {#-
        Cast one value of a record parsed as map<string, string> (JSON scalars as their text) to
        spark_type (a name spark_type_for_pg_type gives; anything else is refused). Values
        Postgres prints that the Spark type cannot hold become null, explicitly (so ANSI mode
        does not fail the model): 'infinity' and '-infinity' timestamps and dates, numeric 'NaN'
        in a decimal. Postgres timestamptz text ends in a +hh offset, which Spark reads only as
        +hh:mm.
    -#}
    {%- if not modules.re.match('^(string|int|bigint|double|boolean|date|timestamp|timestamp_ntz|decimal\\([0-9]+(,[0-9]+)?\\))$', spark_type) -%}
        {{ exceptions.raise_compiler_error('json_text_to_spark_type: unknown Spark type ' ~ spark_type) }}
    {%- endif -%}
    {%- if spark_type == 'string' -%}
        {{ value }}
    {%- elif spark_type == 'timestamp' -%}
        case
            when {{ value }} in ('infinity', '-infinity') then null
            else cast(regexp_replace({{ value }}, '([+-][0-9]{2})$', '$1:00') as timestamp)
        end
    {%- elif spark_type in ('timestamp_ntz', 'date') -%}
        case when {{ value }} in ('infinity', '-infinity') then null else cast({{ value }} as {{ spark_type }}) end
    {%- elif spark_type.startswith('decimal') -%}
        case when {{ value }} = 'NaN' then null else cast({{ value }} as {{ spark_type }}) end
    {%- else -%}
        cast({{ value }} as {{ spark_type }})
    {%- endif -%}
{%- endmacro %}
