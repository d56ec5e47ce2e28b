{% macro mongodb_field_to_spark_type(record, field, spark_type) %}
    {#-
        Read one top-level field of a document in canonical Extended JSON (docs/bronze.md) as
        spark_type: numbers from whichever of $numberInt / $numberLong / $numberDouble /
        $numberDecimal holds them, dates from $date.$numberLong (epoch milliseconds, UTC),
        'objectid' as the hex string, 'json' as the value's Extended JSON text. A value of another
        BSON type than the one asked for becomes null. spark_type must be one of those names or a
        Spark type json_text_to_spark_type takes (anything else is refused, never spliced); a
        field name that is not a plain identifier is addressed as $['name'], and one a JSON path
        cannot hold (a quote or a closing bracket) is refused.
    -#}
    {%- if not modules.re.match('^(objectid|json|string|boolean|timestamp|tinyint|smallint|int|bigint|float|double|decimal\\([0-9]+(,[0-9]+)?\\))$', spark_type) -%}
        {{ exceptions.raise_compiler_error('mongodb_field_to_spark_type: unknown type ' ~ spark_type ~ ' for field ' ~ field) }}
    {%- endif -%}
    {%- if modules.re.match('^[A-Za-z_][A-Za-z0-9_]*$', field) -%}
        {%- set path = '$.' ~ field -%}
    {%- elif "'" in field or ']' in field -%}
        {{ exceptions.raise_compiler_error('mongodb_field_to_spark_type: a JSON path cannot address the field ' ~ field) }}
    {%- else -%}
        {%- set path = "$['" ~ field ~ "']" -%}
    {%- endif -%}
    {%- if spark_type == 'objectid' -%}
        get_json_object({{ record }}, {{ sql_literal(path ~ '.$oid') }})
    {%- elif spark_type in ('string', 'json') -%}
        get_json_object({{ record }}, {{ sql_literal(path) }})
    {%- elif spark_type == 'boolean' -%}
        cast(get_json_object({{ record }}, {{ sql_literal(path) }}) as boolean)
    {%- elif spark_type == 'timestamp' -%}
        timestamp_millis(cast(get_json_object({{ record }}, {{ sql_literal(path ~ '.$date.$numberLong') }}) as bigint))
    {%- else -%}
        cast(coalesce(
            get_json_object({{ record }}, {{ sql_literal(path ~ '.$numberInt') }}),
            get_json_object({{ record }}, {{ sql_literal(path ~ '.$numberLong') }}),
            get_json_object({{ record }}, {{ sql_literal(path ~ '.$numberDouble') }}),
            get_json_object({{ record }}, {{ sql_literal(path ~ '.$numberDecimal') }})
        ) as {{ spark_type }})
    {%- endif -%}
{%- endmacro %}
