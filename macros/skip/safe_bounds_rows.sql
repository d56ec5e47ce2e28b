{% macro safe_bounds_rows(rows) %}
    {#- The SELECT of silver.safe_bounds for changelake_run_state's current_rows, as literals. -#}
    {%- set selects = [] -%}
    {%- for row in rows -%}
        {%- do selects.append('select ' ~ sql_literal(row.source, 'string') ~ ' as source, '
            ~ sql_literal(row.get('safe_lsn'), 'bigint') ~ ' as safe_lsn, '
            ~ sql_literal(row.get('max_observed_lsn'), 'bigint') ~ ' as max_observed_lsn, '
            ~ sql_literal(row.get('writer_count'), 'bigint') ~ ' as writer_count, '
            ~ 'timestamp_micros(' ~ sql_literal(row.get('positions_updated_us'), 'bigint')
            ~ ') as positions_updated_at') -%}
    {%- endfor -%}
    {%- if not selects -%}
        {%- do selects.append('select cast(null as string) as source, cast(null as bigint) as safe_lsn, '
            ~ 'cast(null as bigint) as max_observed_lsn, cast(null as bigint) as writer_count, '
            ~ 'cast(null as timestamp) as positions_updated_at where false') -%}
    {%- endif -%}
    {{ return(selects | join('\n        union all\n        ')) }}
{% endmacro %}
