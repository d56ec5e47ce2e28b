{% macro truncated_table_parts(truncated_table) %}
    {#-
        Two select items splitting one truncated_tables entry ('schema.table', as ingest writes
        it) into table_schema (the text before the first dot) and table_name (the rest).
    -#}
    substring_index({{ truncated_table }}, '.', 1) as table_schema,
    substring({{ truncated_table }}, length(substring_index({{ truncated_table }}, '.', 1)) + 2) as table_name
{%- endmacro %}
