{% macro changelake_touched_tables() %}
    {#-
        The tables (rows of source, table_schema, table_name) this invocation's change batch touched
        (model record_changes, computed in this invocation for the incremental runs of both folds),
        read once per invocation; none when the batch does not bound what the folds write: at parse
        time, when record_changes was not computed in this invocation, or not for every fold (a fold
        built in full, or one reading sequin_events itself). The folds write no other partition in
        such a run: every row they merge is a key of the batch, or a key of a table the batch
        truncated. Used to prune the folds' MERGE (guarded_merge_sql) and the whole-table tests of
        the folds (changelake_touched_tables_predicate).
    -#}
    {%- if not execute -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set batch = graph.get('changelake_change_batch') -%}
    {%- if not batch or batch.invocation_id != invocation_id -%}
        {{ return(none) }}
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
        {{ return(none) }}
    {%- endif -%}
    {%- set cached = graph.get('changelake_touched_tables') -%}
    {%- if cached and cached.invocation_id == invocation_id -%}
        {{ return(cached.rows) }}
    {%- endif -%}
    {%- set touched = query_rows_at_execution(
        'select distinct source, table_schema, table_name from ' ~ found.relation) -%}
    {%- if touched is not none -%}
        {%- do graph.update({'changelake_touched_tables': {'invocation_id': invocation_id, 'rows': touched}}) -%}
    {%- endif -%}
    {{ return(touched) }}
{% endmacro %}
