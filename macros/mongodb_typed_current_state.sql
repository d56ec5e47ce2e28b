{% macro mongodb_typed_current_state(source_name, database, collection, fields) %}
    {#-
        A typed current-state model body for one MongoDB collection: its non-deleted
        consumer_records, one column per listed field, read from the document's canonical
        Extended JSON and cast by mongodb_field_to_spark_type. MongoDB has no schema to derive
        types from, so the model lists its fields: [name, type] for a top-level field, named as
        the field, or [path, type, column], where path is a field name or a list of names (a
        field of nested documents, ['address', 'city']) and column the gold column's name
        (default: the names joined by __), as `changelake-ingest gold generate` writes them from
        the documents in silver. Bookkeeping columns are prefixed _cl_; _cl_record keeps the whole
        document. Names are written as escaped literals and identifiers (sql_literal,
        spark_identifier): a quote in a collection or field name, or in a var() that supplies one,
        cannot end the string. Its own macros are called as changelake.<macro> under dbt:
        generated models call it from the project they live in, which may have installed
        changelake as a package (where an unqualified name is looked up); plain Jinja renderings
        of the macro files have no namespace and find them unqualified.
    -#}
    {%- set literal = changelake.sql_literal if changelake is defined else sql_literal -%}
    {%- set identifier = changelake.spark_identifier if changelake is defined else spark_identifier -%}
    {%- set field_value = changelake.mongodb_field_to_spark_type if changelake is defined else mongodb_field_to_spark_type %}

with

consumer_records as (

    select * from {{ ref('consumer_records') }}

),

current_documents as (

    select *
    from consumer_records
    where
        source = {{ literal(source_name) }}
        and table_schema = {{ literal(database) }}
        and table_name = {{ literal(collection) }}
        and not deleted

),

final as (

    select
        {%- for field in fields %}
            {%- set column = field[2] if field | length > 2 else (field[0] if field[0] is string else field[0] | join('__')) %}
            {{ field_value('record', field[0], field[1]) }} as {{ identifier(column) }},
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
