{% macro changelake_input_versions() %}
    {#-
        For a model configured with skip_when='inputs_unchanged': the Delta version of each
        relation it reads (its refs and sources), as one text ('<relation>@<version>;...'), or
        none when the model has no such config or an input is a view (its content changes with
        the tables under it). Read before the model runs,
        so a write to an input while it runs makes the next run run it again.
        A model may name the inputs that count (config skip_inputs, a list of model or source table
        names): the others are left out, and the model says why their changes alone cannot change
        it (schema_changes reads sequin_events only for commit times, rebuild_when_arrived).
    -#}
    {%- if not execute or config.get('skip_when') != 'inputs_unchanged' -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set parts = [] -%}
    {%- set counted = config.get('skip_inputs') -%}
    {%- for unique_id in model.depends_on.nodes | sort -%}
        {#- A source is a bronze Delta table (register_bronze_tables); a model must be a table. -#}
        {%- set node = graph.nodes.get(unique_id) or graph.sources.get(unique_id) -%}
        {%- if counted is not none and node is not none
            and (node.get('alias') or node.get('identifier') or node.name) not in counted -%}
            {%- continue -%}
        {%- endif -%}
        {%- if node is none or (node.resource_type == 'model'
            and node.config.materialized not in ['table', 'incremental', 'changelake_table', 'changelake_incremental']) -%}
            {{ return(none) }}
        {%- endif -%}
        {%- set relation = api.Relation.create(
            database=node.database, schema=node.schema,
            identifier=node.get('alias') or node.get('identifier') or node.name) -%}
        {%- set history = run_query('describe history ' ~ relation ~ ' limit 1') -%}
        {%- do parts.append(relation ~ '@' ~ history.columns['version'].values()[0]) -%}
    {%- endfor -%}
    {{ return(parts | join(';')) }}
{% endmacro %}
