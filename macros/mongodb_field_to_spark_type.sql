{% macro mongodb_field_to_spark_type(record, field, spark_type) %}
    {#-
        Read one field of a document in canonical Extended JSON (docs/bronze.md) as spark_type:
        numbers from whichever of $numberInt / $numberLong / $numberDouble / $numberDecimal holds
        them, dates from $date.$numberLong (epoch milliseconds, UTC), 'objectid' as the hex
        string, 'json' as the value's Extended JSON text. A value of another BSON type than the
        one asked for becomes null. field is a top-level field name, or a list of names: the path
        to a field of nested documents (['address', 'city'] is address.city; a list, because a
        field name may hold a dot). spark_type must be one of those names or a Spark type
        json_text_to_spark_type takes (anything else is refused, never spliced); a field name that
        is not a plain identifier is addressed as ['name'], and one a JSON path cannot hold (a
        quote or a closing bracket) is refused.
    -#}
    {%- if not modules.re.match('^(objectid|json|string|boolean|timestamp|tinyint|smallint|int|bigint|float|double|decimal\\([0-9]+(,[0-9]+)?\\))$', spark_type) -%}
        {{ exceptions.raise_compiler_error('mongodb_field_to_spark_type: unknown type ' ~ spark_type ~ ' for field ' ~ field) }}
    {%- endif -%}
    {#- changelake.<macro> under dbt (a project that installs changelake as a package looks an
        unqualified name up in itself); plain Jinja renderings of the macro files have no namespace. -#}
    {%- set literal = changelake.sql_literal if changelake is defined else sql_literal -%}
    {%- set names = [field] if field is string else field -%}
    {%- set path -%}
        ${%- for name in names -%}
            {%- if modules.re.match('^[A-Za-z_][A-Za-z0-9_]*$', name) -%}
                .{{ name }}
            {%- elif "'" in name or ']' in name or not name -%}
                {{ exceptions.raise_compiler_error('mongodb_field_to_spark_type: a JSON path cannot address the field ' ~ name) }}
            {%- else -%}
                ['{{ name }}']
            {%- endif -%}
        {%- endfor -%}
    {%- endset -%}
    {%- if spark_type == 'objectid' -%}
        get_json_object({{ record }}, {{ literal(path ~ '.$oid') }})
    {%- elif spark_type in ('string', 'json') -%}
        get_json_object({{ record }}, {{ literal(path) }})
    {%- elif spark_type == 'boolean' -%}
        cast(get_json_object({{ record }}, {{ literal(path) }}) as boolean)
    {%- elif spark_type == 'timestamp' -%}
        timestamp_millis(cast(get_json_object({{ record }}, {{ literal(path ~ '.$date.$numberLong') }}) as bigint))
    {%- else -%}
        cast(coalesce(
            get_json_object({{ record }}, {{ literal(path ~ '.$numberInt') }}),
            get_json_object({{ record }}, {{ literal(path ~ '.$numberLong') }}),
            get_json_object({{ record }}, {{ literal(path ~ '.$numberDouble') }}),
            get_json_object({{ record }}, {{ literal(path ~ '.$numberDecimal') }})
        ) as {{ spark_type }})
    {%- endif -%}
{%- endmacro %}
