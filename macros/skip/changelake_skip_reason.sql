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
          run-wide decision above cannot see. With config skip_inputs only the named inputs
          count, and rebuild_when_arrived runs the model when a left-out input now holds a row
          its table waits for (changelake_awaited_rows_arrived).
        A model whose compiled SQL found, from a lookup of its own, that its statement would
        change nothing says so with changelake_request_skip; that reason is given first.
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
    {%- set requested = changelake_requested_skip() -%}
    {%- if requested is not none -%}
        {{ return(requested) }}
    {%- endif -%}
    {%- if skip_when == 'inputs_unchanged' -%}
        {%- if input_versions is not none and input_versions == changelake_stored_input_versions()
            and not changelake_awaited_rows_arrived() -%}
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
