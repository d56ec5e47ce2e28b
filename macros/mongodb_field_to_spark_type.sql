{% macro mongodb_field_to_spark_type(record, field, spark_type) %}
    {#-
        Read one top-level field of a document in canonical Extended JSON (docs/bronze.md) as
        spark_type: numbers from whichever of $numberInt / $numberLong / $numberDouble /
        $numberDecimal holds them, dates from $date.$numberLong (epoch milliseconds, UTC),
        'objectid' as the hex string, 'json' as the value's Extended JSON text. A value of another
        BSON type than the one asked for becomes null.
    -#}
    {%- set path = '$.' ~ field -%}
    {%- if spark_type == 'objectid' -%}
        get_json_object({{ record }}, '{{ path }}.$oid')
    {%- elif spark_type in ('string', 'json') -%}
        get_json_object({{ record }}, '{{ path }}')
    {%- elif spark_type == 'boolean' -%}
        cast(get_json_object({{ record }}, '{{ path }}') as boolean)
    {%- elif spark_type == 'timestamp' -%}
        timestamp_millis(cast(get_json_object({{ record }}, '{{ path }}.$date.$numberLong') as bigint))
    {%- else -%}
        cast(coalesce(
            get_json_object({{ record }}, '{{ path }}.$numberInt'),
            get_json_object({{ record }}, '{{ path }}.$numberLong'),
            get_json_object({{ record }}, '{{ path }}.$numberDouble'),
            get_json_object({{ record }}, '{{ path }}.$numberDecimal')
        ) as {{ spark_type }})
    {%- endif -%}
{%- endmacro %}
