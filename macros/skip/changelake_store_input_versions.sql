{% macro changelake_store_input_versions(input_versions) %}
    {#- After the model ran: the input versions it read, for the next run's skip_when='inputs_unchanged'. -#}
    {%- if input_versions is not none -%}
        {%- do run_query("alter table " ~ this ~ " set tblproperties ('changelake.input_versions' = "
            ~ sql_literal(input_versions) ~ ")") -%}
    {%- endif -%}
{% endmacro %}
