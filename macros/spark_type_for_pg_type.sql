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
        - arrays, json and jsonb stay their JSON text (a Postgres array type does not fix its
          dimensions, so no one Spark array type fits every value); everything else (text,
          varchar, uuid, time, interval, enums, bytea hex, ...) a string.
    -#}
    case
        when {{ type_name }} like '%[]' then 'string'
        when {{ type_name }} in ('smallint', 'integer', 'int2', 'int4') then 'int'
        when {{ type_name }} in ('bigint', 'int8', 'oid') then 'bigint'
        when {{ type_name }} in ('real', 'double precision', 'float4', 'float8') then 'double'
        when {{ type_name }} in ('boolean', 'bool') then 'boolean'
        when
            {{ type_name }} = 'timestamptz'
            or {{ type_name }} rlike '^timestamp(\\([0-9]+\\))? with time zone$'
            then 'timestamp'
        when {{ type_name }} rlike '^timestamp(\\([0-9]+\\))?( without time zone)?$' then 'timestamp_ntz'
        when {{ type_name }} = 'date' then 'date'
        when
            {{ type_name }} rlike '^numeric\\([0-9]+(,[0-9]+)?\\)$'
            and cast(regexp_extract({{ type_name }}, '^numeric\\(([0-9]+)', 1) as int) between 1 and 38
            and cast(coalesce(nullif(regexp_extract({{ type_name }}, ',([0-9]+)\\)$', 1), ''), '0') as int)
            <= cast(regexp_extract({{ type_name }}, '^numeric\\(([0-9]+)', 1) as int)
            then regexp_replace({{ type_name }}, '^numeric', 'decimal')
        else 'string'
    end
{%- endmacro %}
