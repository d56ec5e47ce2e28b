{% macro changelake_report_completeness() %}
    {#-
        For a model configured with report_completeness=true (gold completeness), after it ran:
        this invocation's certificate as the node's result message, so dbt's console line and
        run_results.json (`adapter_response._message`, with `code` 'completeness') carry, per
        source, "complete through position X, committed through T, verify S" without a
        query of the table. Reads the rows this invocation appended (run_id = invocation_id).
    -#}
    {%- if not config.get('report_completeness') -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set rows = query_rows_at_execution(
        'select source, complete_through_lsn, complete_through_commit_at, verify_status from ' ~ this
        ~ " where run_id = '" ~ invocation_id ~ "' order by source") -%}
    {%- if rows is none -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set parts = [] -%}
    {%- for row in rows -%}
        {%- do parts.append(row.source ~ ' through position ' ~ row.complete_through_lsn
            ~ ', committed through ' ~ (row.get('complete_through_commit_at') or 'never')
            ~ ', verify ' ~ (row.get('verify_status') or 'never run')) -%}
    {%- endfor -%}
    {%- set message = 'complete: ' ~ (parts | join('; ') if parts else 'no loaded bound (silver not built this run)') -%}
    {%- call noop_statement('main', message, code='completeness') -%}
        -- {{ message }}
    {%- endcall -%}
{% endmacro %}
