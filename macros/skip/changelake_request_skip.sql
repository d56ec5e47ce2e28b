{% macro changelake_request_skip(reason) %}
    {#-
        Called by a model's SQL while it compiles, when a lookup it already ran shows that its
        statement would change nothing (snapshot_rows_placed: no snapshot page became usable and
        no whole-table snapshot completed): the materialization then runs no statement and records
        `reason` (changelake_requested_skip, read by changelake_skip_reason). Kept in the `graph`
        dict for this invocation and node; a model compiles right before its materialization runs.
    -#}
    {%- if not execute or model.resource_type == 'unit_test' -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set requests = graph.get('changelake_skip_requests') -%}
    {%- if not requests or requests.invocation_id != invocation_id -%}
        {%- set requests = {'invocation_id': invocation_id, 'nodes': {}} -%}
        {%- do graph.update({'changelake_skip_requests': requests}) -%}
    {%- endif -%}
    {%- do requests.nodes.update({model.unique_id: reason}) -%}
{% endmacro %}
