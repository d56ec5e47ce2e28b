{% macro changelake_skipped_model(reason) %}
    {#- A materialization's result for a model that runs no statement: dbt records `reason`. -#}
    {%- call noop_statement('main', reason) -%}
        -- {{ reason }}
    {%- endcall -%}
    {#- Tests of a model skipped in this invocation may skip too (changelake_test_inputs_unchanged). -#}
    {%- set skipped = graph.get('changelake_skipped_models') -%}
    {%- if not skipped or skipped.invocation_id != invocation_id -%}
        {%- set skipped = {'invocation_id': invocation_id, 'models': []} -%}
        {%- do graph.update({'changelake_skipped_models': skipped}) -%}
    {%- endif -%}
    {%- do skipped.models.append(model.unique_id) -%}
    {{ return({'relations': [this]}) }}
{% endmacro %}
