{% macro changelake_same_rows(left_rows, right_rows, columns) %}
    {#- Whether two lists of per-source rows name the same sources with equal `columns`. -#}
    {%- if left_rows | length != right_rows | length or not left_rows -%}
        {{ return(false) }}
    {%- endif -%}
    {%- for left in left_rows -%}
        {%- set right = right_rows | selectattr('source', 'equalto', left.source) | list -%}
        {%- if right | length != 1 -%}
            {{ return(false) }}
        {%- endif -%}
        {%- for column in columns -%}
            {%- if left.get(column) != right[0].get(column) -%}
                {{ return(false) }}
            {%- endif -%}
        {%- endfor -%}
    {%- endfor -%}
    {{ return(true) }}
{% endmacro %}
