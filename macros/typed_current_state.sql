{% macro typed_current_state(source_name, table_schema, table_name) %}
    {#-
        A typed current-state model body for one source table: its non-deleted consumer_records,
        one column per column of the table's latest shape (silver table_columns), cast from the
        JSON record to the Spark type chosen by spark_type_for_pg_type. Bookkeeping columns are
        prefixed _cl_. The column list is read when the model runs (run_query, guarded by
        execute); before any shape is known the model has only the bookkeeping columns and the raw
        record. Values Postgres prints that the Spark type cannot hold ('infinity' timestamps,
        'NaN' numerics) become null.
    -#}
    {%- set shape = [] -%}
    {%- set table_columns = ref('table_columns') -%}
    {%- set columns_relation = load_relation(table_columns) if execute else none -%}
    {%- if columns_relation is not none -%}
        {%- set shape_query -%}
            select column_name, spark_type
            from {{ columns_relation }}
            where
                source = '{{ source_name }}'
                and table_schema = '{{ table_schema }}'
                and table_name = '{{ table_name }}'
            order by ordinal_position
        {%- endset -%}
        {%- set shape = run_query(shape_query).rows -%}
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
        source = '{{ source_name }}'
        and table_schema = '{{ table_schema }}'
        and table_name = '{{ table_name }}'
        and not deleted

),

final as (

    select
        {%- for column in shape %}
            {{ json_text_to_spark_type("record_values['" ~ column[0] ~ "']", column[1]) }} as `{{ column[0] }}`,
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
