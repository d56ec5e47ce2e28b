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
