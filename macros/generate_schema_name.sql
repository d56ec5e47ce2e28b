{% macro generate_schema_name(custom_schema_name, node) %}
    {#- Folder schemas are used verbatim (silver, gold), not prefixed with the target schema. -#}
    {%- if custom_schema_name is none -%}
        {{ target.schema }}
    {%- else -%}
        {{ custom_schema_name | trim }}
    {%- endif -%}
{% endmacro %}
