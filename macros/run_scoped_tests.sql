{% macro spark__get_where_subquery(relation) -%}
    {#-
        dbt's own get_where_subquery (a generic data test reads `(select * from model where
        <where>)`), with two placeholders a test's `where` config may use, since that config cannot
        call a macro itself (dbt_project.yml gives every silver data test the first one):
        - __changelake_this_run__: for a model skipped when nothing is new (the incremental ones,
          config skip_when='nothing_new'), its rows this run can have written
          (changelake_run_rows_predicate); for any other model `true`, the whole table;
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
    {%- set where = where | replace('__changelake_whole_table__', 'true') -%}
    {%- set filtered -%}
        (select * from {{ relation }} where {{ where }}) dbt_subquery
    {%- endset -%}
    {{ return(filtered) }}
{%- endmacro %}


{% macro changelake_full_tests() %}
    {#- Whether data tests check whole tables this run: var changelake_full_tests (nightly). -#}
    {{ return(var('changelake_full_tests', false) | string | lower in ['true', '1', 'yes']) }}
{% endmacro %}


{% macro changelake_run_rows_predicate(qualifier=none) %}
    {#-
        A predicate on a silver model's `source` and `commit_lsn` keeping the rows this run can
        have written: per source, commit_lsn above the safe bound silver had loaded through before
        the run (loaded_bounds) and at or below the run's safe bound (safe_bounds); every position
        of a source silver had not loaded. `false` when the run has nothing new; `true` (whole
        tables) with var changelake_full_tests, in a `dbt test` that built nothing, or when no node
        of this invocation read the positions.
    -#}
    {%- set state = changelake_run_state(compute=false) -%}
    {%- if changelake_full_tests() or state is none -%}
        {{ return('true') }}
    {%- endif -%}
    {%- set prefix = qualifier ~ '.' if qualifier else '' -%}
    {%- set alternatives = [] -%}
    {%- for current in state.current_rows -%}
        {%- set terms = [prefix ~ 'source = ' ~ sql_literal(current.source)] -%}
        {%- set loaded = state.loaded_rows | selectattr('source', 'equalto', current.source) | list -%}
        {%- if loaded and loaded[0].get('safe_lsn') is not none -%}
            {%- do terms.append(prefix ~ 'commit_lsn > ' ~ sql_literal(loaded[0].get('safe_lsn'))) -%}
        {%- endif -%}
        {%- do terms.append(prefix ~ 'commit_lsn <= ' ~ sql_literal(current.get('safe_lsn'))) -%}
        {%- do alternatives.append('(' ~ terms | join(' and ') ~ ')') -%}
    {%- endfor -%}
    {{ return('(' ~ (alternatives | join(' or ') if alternatives else 'false') ~ ')') }}
{% endmacro %}


{% macro changelake_test_inputs_unchanged() %}
    {#-
        True when this run left every model the current test reads as the last run left it: each
        was skipped in this invocation (its skip_when held; changelake_skipped_model records it),
        so the test would read exactly what the last run's check read. Never with var
        changelake_full_tests, with changelake_skip_unchanged false, or when no node of this
        invocation read the positions (a plain `dbt test`); never for a test reading a model this
        invocation built or did not select. A test whose skip_when_unchanged names a condition
        (e.g. 'nothing_new') is skipped when that condition holds.
    -#}
    {%- set state = changelake_run_state(compute=false) -%}
    {%- if changelake_full_tests() or state is none or not var('changelake_skip_unchanged', true) -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set condition = config.get('skip_when_unchanged') -%}
    {%- if condition is string -%}
        {#- The test names the one condition under which what it checks cannot have changed. -#}
        {{ return(state.get(condition) is sameas true) }}
    {%- endif -%}
    {%- set models = model.depends_on.nodes | select('in', graph.nodes) | list -%}
    {%- if not models -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set skipped = graph.get('changelake_skipped_models') -%}
    {%- if not skipped or skipped.invocation_id != invocation_id -%}
        {{ return(false) }}
    {%- endif -%}
    {%- for unique_id in models -%}
        {%- if unique_id not in skipped.models -%}
            {{ return(false) }}
        {%- endif -%}
    {%- endfor -%}
    {{ return(true) }}
{% endmacro %}


{% macro spark__get_test_sql(main_sql, fail_calc, warn_if, error_if, limit) -%}
    {#-
        dbt's own test query, except for a test configured with skip_when_unchanged (every silver
        data test, dbt_project.yml, and the singular silver tests) on a run that left every model
        it reads unchanged (changelake_test_inputs_unchanged): its result could not differ from
        the last run's, so it passes with a constant row and starts no Spark job.
    -#}
    {%- if config.get('skip_when_unchanged') and changelake_test_inputs_unchanged() -%}
        select cast(0 as bigint) as failures, false as should_warn, false as should_error
    {%- else -%}
        {{ dbt.default__get_test_sql(main_sql, fail_calc, warn_if, error_if, limit) }}
    {%- endif -%}
{%- endmacro %}
