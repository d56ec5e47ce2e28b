{% macro source_ranges(upper_rows, upper_column, lower_rows, lower_column) %}
    {#-
        The ranges source_ranges_predicate takes ([{source, low, high}, ...]), one per row of
        upper_rows: high is that row's upper_column, low the lower_column of the lower_rows row of
        the same source (none, i.e. open, when lower_rows has no row for it). Rows are dicts from
        query_rows_at_execution; none for upper_rows gives no ranges.
    -#}
    {%- set ranges = [] -%}
    {%- for upper in upper_rows or [] -%}
        {%- set lower = ((lower_rows or []) | selectattr('source', 'equalto', upper.source) | list) -%}
        {%- do ranges.append({
            'source': upper.source,
            'low': lower[0].get(lower_column) if lower else none,
            'high': upper.get(upper_column),
        }) -%}
    {%- endfor -%}
    {{ return(ranges) }}
{% endmacro %}
