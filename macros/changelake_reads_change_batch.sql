{% macro changelake_reads_change_batch() %}
    {#-
        For consumer_records and record_history, when this run of the model folds the batch of
        model record_changes: {relation: that model's relation, stored_rows: the model's stored
        positions record_changes looked up for it}; else none (the model then derives its changes from
        sequin_events and snapshot_rows_placed itself, with the same macros). It reads the batch
        only when record_changes was computed in this invocation for this model's incremental run
        (macro record_changes_scan_bounds records that in the graph): a batch left from an earlier
        invocation (`dbt run --select consumer_records`, a `dbt retry` of the fold alone) may lack
        changes above the model's stored position, and a full build needs every change. Never at
        parse time or in a unit test.
    -#}
    {%- if not execute or model.resource_type == 'unit_test' or not is_incremental() -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set batch = graph.get('changelake_change_batch') -%}
    {%- if not batch or batch.invocation_id != invocation_id or model.unique_id not in batch.folds -%}
        {{ return(none) }}
    {%- endif -%}
    {{ return({'relation': ref('record_changes'), 'stored_rows': batch.folds[model.unique_id]}) }}
{% endmacro %}
