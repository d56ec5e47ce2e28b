{% macro spark__get_where_subquery(relation) -%}
    {#-
        dbt's own get_where_subquery (a generic data test reads `(select * from model where
        <where>)`), with three placeholders a test's `where` config may use, since that config cannot
        call a macro itself (dbt_project.yml gives every silver data test the first one):
        - __changelake_this_run__: for a model skipped when nothing is new (the incremental ones,
          config skip_when='nothing_new'), its rows this run can have written
          (changelake_run_rows_predicate); for any other model `true`, the whole table;
        - __changelake_touched_tables__: the tables this run's change batch touched
          (changelake_touched_tables_predicate, on the relation aliased `changelake_tested`): for a
          test of the folds that must see more than this run's rows but only in the tables the run
          wrote (a duplicate key pairs two rows of one table); the whole table with var
          changelake_full_tests, after a full build, or in a `dbt test` that built nothing;
        - __changelake_whole_table__: `true`; it marks a test that must see the whole table (its
          config says why).
    -#}
    {%- set where = config.get('where', '') -%}
    {%- if not where -%}
        {{ return(relation) }}
    {%- endif -%}
    {%- if '__changelake_this_run__' in where -%}
        {%- set tested = graph.nodes.get(model.get('attached_node') or '', {}) -%}
        {%- set this_run = changelake_run_rows_predicate()
            if tested.get('config', {}).get('skip_when') == 'nothing_new' else 'true' -%}
        {%- set where = where | replace('__changelake_this_run__', this_run) -%}
    {%- endif -%}
    {%- if '__changelake_touched_tables__' in where -%}
        {%- set where = where | replace(
            '__changelake_touched_tables__', changelake_touched_tables_predicate('changelake_tested')) -%}
    {%- endif -%}
    {%- set where = where | replace('__changelake_whole_table__', 'true') -%}
    {%- set filtered -%}
        (select * from {{ relation }} as changelake_tested where {{ where }}) dbt_subquery
    {%- endset -%}
    {{ return(filtered) }}
{%- endmacro %}
