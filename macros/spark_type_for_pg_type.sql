{% macro spark_type_for_pg_type(type_name, fields=none) %}
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
        - a composite type (or an array of one: array<struct>), given `fields` (an SQL expression,
          array<struct<name, type_name>> as bronze records a column's fields, null for other
          types), a struct<field:type,...> of its fields in order, each typed as a column of the
          field's type would be, except that a field which is an array or a composite is its
          Postgres text, a string. A composite stays a string when a field's name is not a plain
          identifier ([A-Za-z_][A-Za-z0-9_]*, so the type needs no quoting and a contract can name
          it), two names differ by case alone, or its fields are those of a range's struct;
        - everything else (text, varchar, uuid, time, interval, enums, composites without recorded
          fields, multiranges, bytea hex, ...) a string.
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
    {#- The type of a scalar or range named by the SQL expression cl_pg_type (replaced below). -#}
    {%- set scalar_type -%}
        case
            when cl_pg_type in ('smallint', 'integer', 'int2', 'int4') then 'int'
            when cl_pg_type in ('bigint', 'int8', 'oid') then 'bigint'
            when cl_pg_type in ('real', 'double precision', 'float4', 'float8') then 'double'
            when cl_pg_type in ('boolean', 'bool') then 'boolean'
            when
                cl_pg_type = 'timestamptz'
                or cl_pg_type rlike '^timestamp(\\([0-9]+\\))? with time zone$'
                then 'timestamp'
            when cl_pg_type rlike '^timestamp(\\([0-9]+\\))?( without time zone)?$' then 'timestamp_ntz'
            when cl_pg_type = 'date' then 'date'
            when
                cl_pg_type rlike '^numeric\\([0-9]+(,[0-9]+)?\\)$'
                and cast(regexp_extract(cl_pg_type, '^numeric\\(([0-9]+)', 1) as int) between 1 and 38
                and cast(coalesce(nullif(regexp_extract(cl_pg_type, ',([0-9]+)\\)$', 1), ''), '0') as int)
                <= cast(regexp_extract(cl_pg_type, '^numeric\\(([0-9]+)', 1) as int)
                then regexp_replace(cl_pg_type, '^numeric', 'decimal')
            {%- for range_name, bound in range_bounds.items() %}
            when cl_pg_type = '{{ range_name }}'
                then 'struct<lower:{{ bound }},upper:{{ bound }},lower_inc:boolean,upper_inc:boolean,empty:boolean>'
            {%- endfor %}
            else 'string'
        end
    {%- endset -%}
    {%- set element_type = scalar_type | replace('cl_pg_type', element) -%}
    {%- set composite -%}
        concat(
            'struct<',
            array_join(
                transform(
                    {{ fields }},
                    cl_field -> concat(
                        cl_field.name,
                        ':',
                        case
                            when cl_field.type_name like '%[]' then 'string'
                            else {{ scalar_type | replace('cl_pg_type', 'cl_field.type_name') }}
                        end
                    )
                ),
                ','
            ),
            '>'
        )
    {%- endset -%}
    case
        {%- if fields is not none %}
        when
            size({{ fields }}) > 0
            and forall({{ fields }}, cl_field -> cl_field.name rlike '^[A-Za-z_][A-Za-z0-9_]*$')
            and size(array_distinct(transform({{ fields }}, cl_field -> lower(cl_field.name)))) = size({{ fields }})
            and not {{ composite }} rlike '^struct<lower:.*,upper:.*,lower_inc:boolean,upper_inc:boolean,empty:boolean>$'
            then if({{ type_name }} like '%[]', concat('array<', {{ composite }}, '>'), {{ composite }})
        {%- endif %}
        when {{ type_name }} like '%[]' then concat('array<', {{ element_type }}, '>')
        else {{ element_type }}
    end
{%- endmacro %}
