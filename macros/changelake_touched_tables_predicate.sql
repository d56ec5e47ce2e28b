{% macro changelake_touched_tables_predicate(qualifier) %}
    {#-
        For the whole-table silver tests (the singular ones, and the key uniqueness tests of the
        folds through `where: __changelake_touched_tables__`): a predicate on source, table_schema and
        table_name (qualified by `qualifier`) keeping the tables this run's change batch touched
        (model record_changes, computed in this invocation for the incremental runs of both folds).
        The folds wrote no other partition this run (their stored rows are read and merged by the
        batch's partitions), so a violation elsewhere was there before the run, and the run that
        wrote it checked it. `true` (whole tables) otherwise: with var changelake_full_tests (the
        nightly full check), in a `dbt test` that built nothing, when a fold was built in full or
        the batch was not computed in this invocation, and at parse time.
    -#}
    {%- if not execute or changelake_full_tests() -%}
        {{ return('true') }}
    {%- endif -%}
    {%- set batch = graph.get('changelake_change_batch') -%}
    {%- if not batch or batch.invocation_id != invocation_id -%}
        {{ return('true') }}
    {%- endif -%}
    {%- set found = namespace(relation=none, all_folds=true) -%}
    {%- for node in graph.nodes.values() -%}
        {%- if node.resource_type == 'model' and node.name == 'record_changes' and node.package_name == model.package_name -%}
            {%- set found.relation = api.Relation.create(
                database=node.database, schema=node.schema, identifier=node.get('alias') or node.name) -%}
        {%- endif -%}
        {%- if node.resource_type == 'model' and node.config.get('change_positions') is not none
            and node.unique_id not in batch.folds -%}
            {%- set found.all_folds = false -%}
        {%- endif -%}
    {%- endfor -%}
    {%- if found.relation is none or not found.all_folds -%}
        {{ return('true') }}
    {%- endif -%}
    {#- Read once per invocation (the batch is written before either fold, and every caller runs
        after both); the data tests that call this would otherwise each read it. -#}
    {%- set cached = graph.get('changelake_touched_tables') -%}
    {%- if cached and cached.invocation_id == invocation_id -%}
        {%- set touched = cached.rows -%}
    {%- else -%}
        {%- set touched = query_rows_at_execution(
            'select distinct source, table_schema, table_name from ' ~ found.relation) -%}
        {%- if touched is none -%}
            {{ return('true') }}
        {%- endif -%}
        {%- do graph.update({'changelake_touched_tables': {'invocation_id': invocation_id, 'rows': touched}}) -%}
    {%- endif -%}
    {{ return(partitions_predicate(qualifier, ['source', 'table_schema', 'table_name'], touched)) }}
{% endmacro %}
