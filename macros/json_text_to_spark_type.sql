{% macro json_text_to_spark_type(value, spark_type) %}
    {#-
        Cast one value of a record parsed as map<string, string> (JSON scalars as their text,
        arrays as their JSON text) to spark_type (a type spark_type_for_pg_type gives; anything
        else is refused). Values Postgres prints that the Spark type cannot hold become null,
        explicitly (so ANSI mode does not fail the model): 'infinity' and '-infinity' timestamps
        and dates, numeric 'NaN' in a decimal, a multi-dimensional array (its JSON text is an
        array of arrays: a Postgres array type does not fix its dimensions). Postgres timestamptz
        text ends in a +hh offset, which Spark reads only as +hh:mm.
        An array's elements are cast one by one, as scalars are: the array's JSON text is read as
        array<string> (from_json keeps a JSON number's or boolean's text, a string's value, a
        null's null). A range (Postgres' text, `[lower,upper)`, `empty`) is split with regular
        expressions: the built-in ranges' bounds never hold a comma or a quote, and a bound with
        a space (a timestamp) is in double quotes; an unbounded side is an empty bound, null here.
    -#}
    {#- changelake.<macro> under dbt (a project that installs changelake as a package looks an
        unqualified name up in itself); plain Jinja renderings of the macro files have no namespace. -#}
    {%- set cast_to = changelake.json_text_to_spark_type if changelake is defined else json_text_to_spark_type -%}
    {%- set scalar = 'string|int|bigint|double|boolean|date|timestamp|timestamp_ntz|decimal\\([0-9]+(,[0-9]+)?\\)' -%}
    {%- set range_type = modules.re.match(
        '^struct<lower:(' ~ scalar ~ '),upper:\\1,lower_inc:boolean,upper_inc:boolean,empty:boolean>$', spark_type
    ) -%}
    {%- set array_type = modules.re.match('^array<(.*)>$', spark_type) -%}
    {#- A composite's struct: fields named by plain identifiers, each a scalar or a range. -#}
    {%- set scalar_type = scalar | replace('(,[0-9]+)?', '(?:,[0-9]+)?') -%}
    {%- set field_type = '(?:' ~ scalar_type ~ '|struct<lower:(?:' ~ scalar_type ~ '),upper:(?:' ~ scalar_type
        ~ '),lower_inc:boolean,upper_inc:boolean,empty:boolean>)' -%}
    {%- set field = '([A-Za-z_][A-Za-z0-9_]*):(' ~ field_type ~ ')' -%}
    {#- (one whose fields are a range's is not: spark_type_for_pg_type leaves such a composite text) -#}
    {%- set composite_type = not modules.re.match(
            '^struct<lower:.*,upper:.*,lower_inc:boolean,upper_inc:boolean,empty:boolean>$', spark_type
        ) and modules.re.match('^struct<' ~ field ~ '(?:,' ~ field ~ ')*>$', spark_type) -%}
    {%- if array_type and not array_type.group(1).startswith('array<') -%}
        case
            when {{ value }} rlike '^\\[\\s*\\[' then null
            else transform(
                from_json({{ value }}, 'array<string>'),
                cl_element -> {{ cast_to('cl_element', array_type.group(1)) }}
            )
        end
    {%- elif range_type -%}
        {%- set bound = range_type.group(1) -%}
        case
            when {{ value }} is null then null
            when {{ value }} = 'empty'
                then named_struct(
                    'lower', cast(null as {{ bound }}),
                    'upper', cast(null as {{ bound }}),
                    'lower_inc', false,
                    'upper_inc', false,
                    'empty', true
                )
            else named_struct(
                'lower', {{ cast_to("nullif(regexp_extract(" ~ value ~ ", '^[\\\\[(]\"?([^\",]*)', 1), '')", bound) }},
                'upper', {{ cast_to("nullif(regexp_extract(" ~ value ~ ", ',\"?([^\",]*)\"?[\\\\])]$', 1), '')", bound) }},
                'lower_inc', startswith({{ value }}, '['),
                'upper_inc', endswith({{ value }}, ']'),
                'empty', false
            )
        end
    {%- elif composite_type -%}
        {%- set fields = modules.re.findall(field ~ '(?:,|>$)', spark_type[7:]) -%}
        case
            when {{ value }} is null then null
            else element_at(
                transform(
                    array(
                        transform(
                            regexp_extract_all(
                                concat(',', substr({{ value }}, 2, length({{ value }}) - 2)),
                                ',("(?:[^"]++|"")*+"|[^,"]*+)',
                                1
                            ),
                            cl_field -> case
                                when cl_field = '' then null
                                when startswith(cl_field, '"')
                                    then replace(
                                        replace(substr(cl_field, 2, length(cl_field) - 2), '""', '"'), '\\\\', '\\'
                                    )
                                else cl_field
                            end
                        )
                    ),
                    cl_fields -> named_struct(
                        {%- for name, type in fields %}
                            '{{ name }}', {{ cast_to('get(cl_fields, ' ~ loop.index0 ~ ')', type) }}{{ ',' if not loop.last }}
                        {%- endfor %}
                    )
                ),
                1
            )
        end
    {%- elif not modules.re.match('^(' ~ scalar ~ ')$', spark_type) -%}
        {{ exceptions.raise_compiler_error('json_text_to_spark_type: unknown Spark type ' ~ spark_type) }}
    {%- elif spark_type == 'string' -%}
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
