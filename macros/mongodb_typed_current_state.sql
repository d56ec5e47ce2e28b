{% macro mongodb_typed_current_state(source_name, database, collection, fields) %}
    {#-
        A typed current-state model body for one MongoDB collection: its non-deleted
        consumer_records, one column per listed top-level field, read from the document's
        canonical Extended JSON and cast by mongodb_field_to_spark_type. MongoDB has no schema to
        derive types from, so the model lists its fields: [[name, type], ...]. Bookkeeping columns
        are prefixed _cl_; _cl_record keeps the whole document. Names are written as escaped
        literals and identifiers (sql_literal, spark_identifier): a quote in a collection or field
        name, or in a var() that supplies one, cannot end the string.
    -#}

with

consumer_records as (

    select * from {{ ref('consumer_records') }}

),

current_documents as (

    select *
    from consumer_records
    where
        source = {{ sql_literal(source_name) }}
        and table_schema = {{ sql_literal(database) }}
        and table_name = {{ sql_literal(collection) }}
        and not deleted

),

final as (

    select
        {%- for field in fields %}
            {{ mongodb_field_to_spark_type('record', field[0], field[1]) }} as {{ spark_identifier(field[0]) }},
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
