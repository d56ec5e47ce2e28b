{% macro check_merge_guard() %}
    {#-
        `dbt run-operation check_merge_guard [--target T]`: proves on target T that this project's
        guarded MERGE (what get_merge_sql gives a model with merge_guard on every Spark adapter:
        spark__get_merge_sql, databricks__get_merge_sql) keeps a stored row against an older
        batch row of the same key. Creates two scratch Delta tables in the target schema, merges,
        compares, drops them; fails with the rows it found if the guard did not hold.
    -#}
    {%- set stored = api.Relation.create(schema=target.schema, identifier='changelake_merge_guard_check') -%}
    {%- set batch = api.Relation.create(schema=target.schema, identifier='changelake_merge_guard_check_batch') -%}
    {%- set scratch = [stored, batch, stored.incorporate(path={'identifier': stored.identifier ~ '__dbt_batch'})] -%}
    {%- do run_query(
        'create or replace table ' ~ stored ~ ' using delta as select * from values'
        ~ " (1, 200, 0, 'stored, newer'), (2, 100, 5, 'stored, older')"
        ~ ' as t(k, commit_lsn, commit_index, v)'
    ) -%}
    {%- do run_query(
        'create or replace table ' ~ batch ~ ' using delta as select * from values'
        ~ " (1, 100, 9, 'batch, older'), (2, 100, 6, 'batch, newer'), (3, 1, 0, 'batch, new key')"
        ~ ' as t(k, commit_lsn, commit_index, v)'
    ) -%}
    {%- do run_query(guarded_merge_sql(stored, batch, ['k'], ['commit_lsn', 'commit_index'], [], none)) -%}
    {%- set found = [] -%}
    {%- for row in run_query('select k, v from ' ~ stored ~ ' order by k').rows -%}
        {%- do found.append(row[0] ~ ': ' ~ row[1]) -%}
    {%- endfor -%}
    {%- for relation in scratch -%}
        {%- do run_query('drop table if exists ' ~ relation) -%}
    {%- endfor -%}
    {%- set expected = ['1: stored, newer', '2: batch, newer', '3: batch, new key'] -%}
    {%- if found != expected -%}
        {{ exceptions.raise_compiler_error(
            'the merge guard did not hold on target ' ~ target.name ~ ' (' ~ target.type ~ '): expected '
            ~ expected | join('; ') ~ ', found ' ~ found | join('; ')) }}
    {%- endif -%}
    {{ log('merge guard holds on target ' ~ target.name ~ ' (' ~ target.type ~ '): ' ~ found | join('; '), info=True) }}
{% endmacro %}
