{% macro typed_current_state(source_name, table_schema, table_name, columns=none) %}
    {#-
        A typed current-state model body for one source table: its non-deleted consumer_records,
        one column per source column, cast from the JSON record to its Spark type
        (json_text_to_spark_type). Bookkeeping columns are prefixed _cl_.
        columns: [column_name, spark_type, output_name] per column, as `changelake-ingest gold
        generate` writes them from silver table_columns (output_name differs from column_name
        only where two names differ by case alone, or a name is a bookkeeping one). Without it the
        columns are read from table_columns when the model runs (run_query, guarded by execute).
        Every name is quoted and escaped, as a string literal or a backtick identifier (review
        S1): a column named with a quote, a backtick, a space or SQL in it is just a column.
        Its own macros are called as changelake.<macro>: generated models call it from the project
        they live in, which may have installed changelake as a package (the caller's project is
        where an unqualified name is looked up).
    -#}
    {%- set shape = [] -%}
    {%- if columns is not none -%}
        {%- set shape = columns -%}
    {%- else -%}
        {%- set table_columns = ref('table_columns') -%}
        {%- set columns_relation = load_relation(table_columns) if execute else none -%}
        {%- if columns_relation is not none -%}
            {%- set shape_query -%}
                select column_name, spark_type, column_name
                from {{ columns_relation }}
                where
                    source = {{ changelake.sql_literal(source_name) }}
                    and table_schema = {{ changelake.sql_literal(table_schema) }}
                    and table_name = {{ changelake.sql_literal(table_name) }}
                order by ordinal_position
            {%- endset -%}
            {%- set shape = run_query(shape_query).rows -%}
        {%- endif -%}
    {%- endif %}

with

consumer_records as (

    select * from {{ ref('consumer_records') }}

),

current_rows as (

    select
        *,
        from_json(record, 'map<string, string>') as record_values
    from consumer_records
    where
        source = {{ changelake.sql_literal(source_name) }}
        and table_schema = {{ changelake.sql_literal(table_schema) }}
        and table_name = {{ changelake.sql_literal(table_name) }}
        and not deleted

),

final as (

    select
        {%- for column in shape %}
            {{ changelake.json_text_to_spark_type('record_values[' ~ changelake.sql_literal(column[0]) ~ ']', column[1]) }}
            as {{ changelake.spark_identifier(column[2]) }},
        {%- endfor %}
        {%- if not shape %}
            record as _cl_record,
        {%- endif %}
        record_pk as _cl_record_pk,
        source as _cl_source,
        needs_reread as _cl_needs_reread,
        commit_lsn as _cl_commit_lsn,
        commit_index as _cl_commit_index,
        seq as _cl_seq,
        updated_at as _cl_updated_at
    from current_rows

)

select * from final
{%- endmacro %}
