{% macro mongodb_typed_current_state(source_name, database, collection, fields) %}
    {#-
        A typed current-state model body for one MongoDB collection: its non-deleted
        consumer_records, one column per listed top-level field, read from the document's
        canonical Extended JSON and cast by mongodb_field_to_spark_type. MongoDB has no schema to
        derive types from, so the model lists its fields: [[name, type], ...]. Bookkeeping columns
        are prefixed _cl_; _cl_record keeps the whole document.
    -#}

with

consumer_records as (

    select * from {{ ref('consumer_records') }}

),

current_documents as (

    select *
    from consumer_records
    where
        source = '{{ source_name }}'
        and table_schema = '{{ database }}'
        and table_name = '{{ collection }}'
        and not deleted

),

final as (

    select
        {%- for field in fields %}
            {{ mongodb_field_to_spark_type('record', field[0], field[1]) }} as `{{ field[0] }}`,
        {%- endfor %}
        record as _cl_record,
        record_pk as _cl_record_pk,
        source as _cl_source,
        commit_lsn as _cl_commit_lsn,
        commit_index as _cl_commit_index,
        seq as _cl_seq,
        updated_at as _cl_updated_at
    from current_documents

)

select * from final
{%- endmacro %}
