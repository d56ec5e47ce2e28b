{% macro changelake_requested_skip() %}
    {#- The reason this node's SQL gave changelake_request_skip in this invocation, or none. -#}
    {%- set requests = graph.get('changelake_skip_requests') -%}
    {%- if not requests or requests.invocation_id != invocation_id -%}
        {{ return(none) }}
    {%- endif -%}
    {{ return(requests.nodes.get(model.unique_id)) }}
{% endmacro %}
