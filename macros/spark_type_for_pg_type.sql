{% macro spark_type_for_pg_type(type_name) %}
    {#-
        SQL expression: the Spark type a Postgres column (format_type() with its modifier, or a
        short alias) is cast to in gold (docs/dbt.md, "Gold types"):
        - int2/int4 int, int8 and oid bigint, real and double precision double (NaN and
          +-Infinity kept: Spark doubles hold them), boolean boolean, date date;
        - timestamp with time zone (any precision) timestamp (UTC), timestamp without time zone
          timestamp_ntz;
        - numeric(p,s) decimal(p,s) when 0 <= s <= p <= 38; unbounded numeric, wider or
          negative-scale numerics stay a string, Postgres' exact text (no Spark decimal holds
          every such value exactly);
        - json and jsonb their JSON text, a string (not variant: Spark's Thrift server, the
          cluster target's, cannot return a variant column);
        - the built-in ranges (int4range, int8range, numrange, daterange, tsrange, tstzrange) a
          struct<lower, upper, lower_inc, upper_inc, empty> whose bounds have the type the range's
          element maps to;
        - an array array<the element's type> (format_type names every array `element[]`,
          whatever its dimensions; json_text_to_spark_type makes a multi-dimensional value null);
        - everything else (text, varchar, uuid, time, interval, enums, composites, multiranges,
          bytea hex, ...) a string.
    -#}
    {%- set element -%}
        regexp_replace({{ type_name }}, '\\[\\]$', '')
    {%- endset -%}
    {%- set range_bounds = {
        'int4range': 'int',
        'int8range': 'bigint',
        'numrange': 'string',
        'daterange': 'date',
        'tsrange': 'timestamp_ntz',
        'tstzrange': 'timestamp',
    } -%}
    {%- set element_type -%}
        case
            when {{ element }} in ('smallint', 'integer', 'int2', 'int4') then 'int'
            when {{ element }} in ('bigint', 'int8', 'oid') then 'bigint'
            when {{ element }} in ('real', 'double precision', 'float4', 'float8') then 'double'
            when {{ element }} in ('boolean', 'bool') then 'boolean'
            when
                {{ element }} = 'timestamptz'
                or {{ element }} rlike '^timestamp(\\([0-9]+\\))? with time zone$'
                then 'timestamp'
            when {{ element }} rlike '^timestamp(\\([0-9]+\\))?( without time zone)?$' then 'timestamp_ntz'
            when {{ element }} = 'date' then 'date'
            when
                {{ element }} rlike '^numeric\\([0-9]+(,[0-9]+)?\\)$'
                and cast(regexp_extract({{ element }}, '^numeric\\(([0-9]+)', 1) as int) between 1 and 38
                and cast(coalesce(nullif(regexp_extract({{ element }}, ',([0-9]+)\\)$', 1), ''), '0') as int)
                <= cast(regexp_extract({{ element }}, '^numeric\\(([0-9]+)', 1) as int)
                then regexp_replace({{ element }}, '^numeric', 'decimal')
            {%- for range_name, bound in range_bounds.items() %}
            when {{ element }} = '{{ range_name }}'
                then 'struct<lower:{{ bound }},upper:{{ bound }},lower_inc:boolean,upper_inc:boolean,empty:boolean>'
            {%- endfor %}
            else 'string'
        end
    {%- endset -%}
    case
        when {{ type_name }} like '%[]' then concat('array<', {{ element_type }}, '>')
        else {{ element_type }}
    end
{%- endmacro %}
