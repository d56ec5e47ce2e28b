{% macro spark_type_for_pg_type(type_name) %}
    {#-
        SQL expression: the Spark type a Postgres column (format_type() name, or its short alias)
        is cast to in gold. numeric(p,s) becomes decimal(p,s) up to Spark's 38 digits; unbounded
        numeric (and wider) stays a string, as Postgres printed it, because no Spark decimal holds
        every such value exactly. Arrays, json, text-like and unknown types stay strings (JSON text
        for arrays and json).
    -#}
    case
        when {{ type_name }} like '%[]' then 'string'
        when {{ type_name }} in ('smallint', 'integer', 'int2', 'int4') then 'int'
        when {{ type_name }} in ('bigint', 'int8', 'oid') then 'bigint'
        when {{ type_name }} in ('real', 'double precision', 'float4', 'float8') then 'double'
        when {{ type_name }} in ('boolean', 'bool') then 'boolean'
        when {{ type_name }} in ('timestamp with time zone', 'timestamptz') then 'timestamp'
        when {{ type_name }} in ('timestamp without time zone', 'timestamp') then 'timestamp_ntz'
        when {{ type_name }} = 'date' then 'date'
        when
            {{ type_name }} rlike '^numeric\\([0-9]+(,[0-9]+)?\\)$'
            and cast(regexp_extract({{ type_name }}, '^numeric\\(([0-9]+)', 1) as int) <= 38
            then regexp_replace({{ type_name }}, '^numeric', 'decimal')
        else 'string'
    end
{%- endmacro %}
