{% macro changelake_awaited_rows_arrived() %}
    {#-
        For a model skipped as 'inputs_unchanged' with config rebuild_when_arrived: whether an input
        it leaves out of its versions (skip_inputs) now holds a row its stored table still waits
        for, so it must run after all. The config names `input` (a model the model refs), the
        input's `column` and this table's `null_column` and `position_column`: this table's rows
        with null_column null wait for the input row of their source whose column equals their
        position. One lookup with the positions as literals (Delta skips the input's other files);
        none when no row waits.
    -#}
    {%- set awaited = config.get('rebuild_when_arrived') -%}
    {%- if awaited is none -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set waiting = query_rows_at_execution(
        'select distinct source, ' ~ awaited.position_column ~ ' as position from ' ~ this
        ~ ' where ' ~ awaited.null_column ~ ' is null and ' ~ awaited.position_column ~ ' is not null') -%}
    {%- if not waiting -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set alternatives = [] -%}
    {%- for row in waiting -%}
        {%- do alternatives.append('(source = ' ~ sql_literal(row['source']) ~ ' and ' ~ awaited.column
            ~ ' = ' ~ sql_literal(row['position']) ~ ')') -%}
    {%- endfor -%}
    {%- set found = run_query(
        'select 1 from ' ~ ref(awaited.input) ~ ' where ' ~ awaited.column ~ ' in ('
        ~ waiting | map(attribute='position') | unique | join(', ') ~ ') and ('
        ~ alternatives | join(' or ') ~ ') limit 1') -%}
    {{ return(found.rows | length > 0) }}
{% endmacro %}
