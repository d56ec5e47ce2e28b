{% macro changelake_skip_reason(input_versions=none) %}
    {#-
        Why this model need not run, or none. A model opts in with the config `skip_when`:
        - 'nothing_new': the run finds no source's safe bound past what silver loaded
          (changelake_run_state().nothing_new): the incremental silver models would add nothing;
        - 'positions_unchanged': bronze.stream_positions holds what the last run built from: the
          models computed from positions and relation shapes would be rewritten unchanged;
        - 'bounds_loaded': every source's safe bound is the one silver loaded through
          (loaded_bounds would be rewritten unchanged);
        - 'inputs_unchanged': every relation the model reads is at the Delta version it was when
          the model last ran (`input_versions`, from changelake_input_versions, equals the table
          property the last run stored). For the gold tables: their inputs are models and sources
          that any invocation may have changed (`dbt run --select silver`, a `verify`), which the
          run-wide decision above cannot see.
        Never skipped: a model whose table does not exist yet, a --full-refresh, a model without
        the config, or a var changelake_skip_unchanged set to false.
    -#}
    {%- set skip_when = config.get('skip_when') -%}
    {%- if skip_when is none or not var('changelake_skip_unchanged', true) -%}
        {{ return(none) }}
    {%- endif -%}
    {%- if skip_when not in ['nothing_new', 'positions_unchanged', 'bounds_loaded', 'inputs_unchanged'] -%}
        {%- do exceptions.raise_compiler_error(
            "skip_when must be 'nothing_new', 'positions_unchanged', 'bounds_loaded' or 'inputs_unchanged', got '"
            ~ skip_when ~ "'") -%}
    {%- endif -%}
    {%- if should_full_refresh() or load_cached_relation(this) is none -%}
        {{ return(none) }}
    {%- endif -%}
    {%- if skip_when == 'inputs_unchanged' -%}
        {%- if input_versions is not none and input_versions == changelake_stored_input_versions() -%}
            {{ return('skipped: inputs unchanged') }}
        {%- endif -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set state = changelake_run_state() -%}
    {%- if state is not none and state[skip_when] -%}
        {{ return({
            'nothing_new': 'skipped: nothing new past the loaded safe bound',
            'positions_unchanged': 'skipped: positions unchanged',
            'bounds_loaded': 'skipped: bounds already loaded',
        }[skip_when]) }}
    {%- endif -%}
    {{ return(none) }}
{% endmacro %}


{% macro changelake_input_versions() %}
    {#-
        For a model configured with skip_when='inputs_unchanged': the Delta version of each
        relation it reads (its refs and sources), as one text ('<relation>@<version>;...'), or
        none when the model has no such config or an input is a view (its content changes with
        the tables under it). Read before the model runs,
        so a write to an input while it runs makes the next run run it again.
    -#}
    {%- if not execute or config.get('skip_when') != 'inputs_unchanged' -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set parts = [] -%}
    {%- for unique_id in model.depends_on.nodes | sort -%}
        {#- A source is a bronze Delta table (register_bronze_tables); a model must be a table. -#}
        {%- set node = graph.nodes.get(unique_id) or graph.sources.get(unique_id) -%}
        {%- if node is none or (node.resource_type == 'model'
            and node.config.materialized not in ['table', 'incremental', 'changelake_table', 'changelake_incremental']) -%}
            {{ return(none) }}
        {%- endif -%}
        {%- set relation = api.Relation.create(
            database=node.database, schema=node.schema,
            identifier=node.get('alias') or node.get('identifier') or node.name) -%}
        {%- set history = run_query('describe history ' ~ relation ~ ' limit 1') -%}
        {%- do parts.append(relation ~ '@' ~ history.columns['version'].values()[0]) -%}
    {%- endfor -%}
    {{ return(parts | join(';')) }}
{% endmacro %}


{% macro changelake_stored_input_versions() %}
    {#- What changelake_store_input_versions stored on `this` after its last run (none: nothing). -#}
    {%- set rows = run_query("show tblproperties " ~ this ~ " ('changelake.input_versions')").rows -%}
    {%- set value = rows[0][1] if rows | length == 1 and rows[0][0] == 'changelake.input_versions' else none -%}
    {{ return(value) }}
{% endmacro %}


{% macro changelake_store_input_versions(input_versions) %}
    {#- After the model ran: the input versions it read, for the next run's skip_when='inputs_unchanged'. -#}
    {%- if input_versions is not none -%}
        {%- do run_query("alter table " ~ this ~ " set tblproperties ('changelake.input_versions' = "
            ~ sql_literal(input_versions) ~ ")") -%}
    {%- endif -%}
{% endmacro %}


{% macro changelake_skipped_model(reason) %}
    {#- A materialization's result for a model that runs no statement: dbt records `reason`. -#}
    {%- call noop_statement('main', reason) -%}
        -- {{ reason }}
    {%- endcall -%}
    {#- Tests of a model skipped in this invocation may skip too (changelake_test_inputs_unchanged). -#}
    {%- set skipped = graph.get('changelake_skipped_models') -%}
    {%- if not skipped or skipped.invocation_id != invocation_id -%}
        {%- set skipped = {'invocation_id': invocation_id, 'models': []} -%}
        {%- do graph.update({'changelake_skipped_models': skipped}) -%}
    {%- endif -%}
    {%- do skipped.models.append(model.unique_id) -%}
    {{ return({'relations': [this]}) }}
{% endmacro %}


{#-
    dbt-spark's own materializations, preceded by changelake_skip_reason: a model configured with
    skip_when runs no statement (and its compiled SQL ran no lookup) when the run finds nothing it
    would change. They have names of their own rather than overriding `incremental` and `table`:
    dbt ignores an installed package's override of a built-in materialization, so the same
    materializations work where changelake is the root project and where it is a package of
    another project. is_incremental (macros/is_incremental.sql) counts changelake_incremental.
-#}
{% materialization changelake_incremental, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set input_versions = changelake_input_versions() -%}
    {%- set reason = changelake_skip_reason(input_versions) -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {%- set result = dbt.materialization_incremental_spark() -%}
    {%- do changelake_store_input_versions(input_versions) -%}
    {{ return(result) }}
{%- endmaterialization %}


{% materialization changelake_table, adapter='spark', supported_languages=['sql', 'python'] -%}
    {%- set input_versions = changelake_input_versions() -%}
    {%- set reason = changelake_skip_reason(input_versions) -%}
    {%- if reason is not none -%}
        {{ return(changelake_skipped_model(reason)) }}
    {%- endif -%}
    {%- set result = dbt.materialization_table_spark() -%}
    {%- do changelake_store_input_versions(input_versions) -%}
    {{ return(result) }}
{%- endmaterialization %}
