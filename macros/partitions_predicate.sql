{% macro partitions_predicate(qualifier, columns, rows) %}
    {#-
        A predicate true exactly for the listed partitions: `(q.c1 = 'v1' and q.c2 = 'v2') or ...`
        over `columns` (qualified by `qualifier`), one alternative per row of `rows` (dicts keyed by
        column, as query_rows_at_execution returns them; a missing value is NULL). No rows gives
        `false`. As literals on partition columns they prune a Delta scan or MERGE to those
        partitions.
    -#}
    {%- set alternatives = [] -%}
    {%- for row in rows -%}
        {%- set equalities = [] -%}
        {%- for column in columns -%}
            {%- set value = row.get(column) -%}
            {%- if value is none -%}
                {%- do equalities.append(qualifier ~ '.' ~ column ~ ' is null') -%}
            {%- else -%}
                {%- do equalities.append(qualifier ~ '.' ~ column ~ ' = ' ~ sql_literal(value | string)) -%}
            {%- endif -%}
        {%- endfor -%}
        {%- do alternatives.append('(' ~ equalities | join(' and ') ~ ')') -%}
    {%- endfor -%}
    {{ return('(' ~ (alternatives | join(' or ') if alternatives else 'false') ~ ')') }}
{% endmacro %}
