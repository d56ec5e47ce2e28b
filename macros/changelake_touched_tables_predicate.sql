{% macro changelake_touched_tables_predicate(qualifier) %}
    {#-
        For the whole-table silver tests (the singular ones, and the key uniqueness tests of the
        folds through `where: __changelake_touched_tables__`): a predicate on source, table_schema and
        table_name (qualified by `qualifier`) keeping the tables this run's change batch touched
        (changelake_touched_tables). The folds wrote no other partition this run, so a violation
        elsewhere was there before the run, and the run that wrote it checked it. `true` (whole
        tables) otherwise: with var changelake_full_tests (the nightly full check), in a `dbt test`
        that built nothing, when a fold was built in full or the batch was not computed in this
        invocation, and at parse time.
    -#}
    {%- if not execute or changelake_full_tests() -%}
        {{ return('true') }}
    {%- endif -%}
    {%- set touched = changelake_touched_tables() -%}
    {%- if touched is none -%}
        {{ return('true') }}
    {%- endif -%}
    {{ return(partitions_predicate(qualifier, ['source', 'table_schema', 'table_name'], touched)) }}
{% endmacro %}
