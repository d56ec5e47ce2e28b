{% macro guarded_merge_sql(target, source, unique_key, guard_columns, prune_columns, incremental_predicates) %}
    {#-
        MERGE the batch (one row per unique_key, already reduced by the model) into target:
        - a matched row is replaced only when the batch row is strictly newer by guard_columns,
          compared as a tuple (lexicographically), so an older position never overwrites a newer
          one whatever order batches arrive in;
        - an unmatched row is inserted; nothing is ever deleted (deletes are soft, in the data).
        prune_columns (the target's partition columns) are turned into literal predicates listing
        only the partitions present in the batch, so Delta rewrites those partitions only and the
        cost follows the batch, not the table.
    -#}
    {%- set keys = [unique_key] if unique_key is string else unique_key -%}
    {%- set predicates = [] if incremental_predicates is none else [] + incremental_predicates -%}
    {%- for key in keys -%}
        {%- do predicates.append('dbt_internal_dest.' ~ key ~ ' = dbt_internal_source.' ~ key) -%}
    {%- endfor -%}

    {#- The batch arrives as a temporary view over the model's query, which each pass of the MERGE
        would otherwise run again (Delta reads the source twice and does not use a cached view).
        - On Spark, for a fold whose batch is bounded by this invocation's change batch
          (changelake_touched_tables: the tables it touched, known before the fold runs), the MERGE
          reads the view and Delta materializes it once itself (merge.materializeSource = all: a
          local checkpoint of the source's rows, no Parquet and no commit); the target is pruned to
          the touched tables.
        - Otherwise (dbt-databricks, whose SQL warehouses do not take that setting; a fold built
          from sequin_events; the merge guard's own check) the batch is written once to a Delta
          table next to the target, which the model's post-hook drops, and the target is pruned to
          the partitions a distinct query finds in it. -#}
    {%- set touched = none -%}
    {%- if execute and adapter.type() == 'spark' and prune_columns | list == ['source', 'table_schema', 'table_name'] -%}
        {%- set touched = changelake_touched_tables() -%}
    {%- endif -%}
    {%- if touched -%}
        {%- do run_query('set spark.databricks.delta.merge.materializeSource = all') -%}
        {%- set batch = source -%}
        {%- do predicates.append(partitions_predicate('dbt_internal_dest', prune_columns, touched)) -%}
    {%- else -%}
        {%- set batch = target.incorporate(path={'identifier': target.identifier ~ '__dbt_batch'}) -%}
        {%- if execute -%}
            {%- do run_query('create or replace table ' ~ batch ~ ' using delta as select * from ' ~ source) -%}
        {%- endif -%}
        {%- if prune_columns and execute -%}
            {%- set batch_partitions = query_rows_at_execution(
                'select distinct ' ~ prune_columns | join(', ') ~ ' from ' ~ batch) -%}
            {%- do predicates.append(partitions_predicate('dbt_internal_dest', prune_columns, batch_partitions)) -%}
        {%- endif -%}
    {%- endif -%}

    {#- (a1, a2, ...) > (b1, b2, ...) spelled out, as Spark has no row-value comparison. -#}
    {%- set newer = [] -%}
    {%- for column in guard_columns -%}
        {%- set equal_before = [] -%}
        {%- for earlier in guard_columns[:loop.index0] -%}
            {%- do equal_before.append('dbt_internal_source.' ~ earlier ~ ' = dbt_internal_dest.' ~ earlier) -%}
        {%- endfor -%}
        {%- set greater = 'dbt_internal_source.' ~ column ~ ' > dbt_internal_dest.' ~ column -%}
        {%- do newer.append('(' ~ (equal_before + [greater]) | join(' and ') ~ ')') -%}
    {%- endfor %}

    merge into {{ target }} as dbt_internal_dest
    using {{ batch }} as dbt_internal_source
    on {{ predicates | join('\n        and ') }}
    when matched and ({{ newer | join(' or ') }}) then update set *
    when not matched then insert *
{% endmacro %}
