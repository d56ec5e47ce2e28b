{% macro record_changes_scan_bounds() %}
    {#-
        The lookups model record_changes turns into literals before its query is planned, as a
        dict: `folds`, the models folding it (those that ref it and set the config
        change_positions) that will run incrementally now (their table exists and this is not
        their --full-refresh), each with its stored positions (rows of source, max_seq,
        max_commit_lsn); `empty`, true when there is none (a fold built in
        full reads sequin_events itself, so the batch holds nothing); and `bounds`, macro
        consumer_records_scan_bounds' filters for the lower of those folds' stored positions per
        source (a source one of them has not stored is read whole). Each fold's positions come from
        its config `change_positions` (macro change_positions_query). At execution (not at parse
        time, in a unit test or when the model is skipped) it records in the graph, for this
        invocation, which folds the batch was computed for and their positions: only those read
        it, and take those positions rather than query them again (the folds run after this model,
        so they still hold; macro changelake_reads_change_batch).
    -#}
    {%- set result = {'folds': {}, 'empty': false, 'bounds': {'stored_rows': none}} -%}
    {%- if not execute or model.resource_type == 'unit_test' or changelake_skip_reason() is not none -%}
        {{ return(result) }}
    {%- endif -%}
    {%- set per_fold = [] -%}
    {%- for node in graph.nodes.values() | sort(attribute='unique_id') -%}
        {%- set positions = node.config.get('change_positions') if node.resource_type == 'model' else none -%}
        {%- if positions is not none and model.unique_id in node.depends_on.nodes -%}
            {%- set relation = api.Relation.create(
                database=node.database, schema=node.schema, identifier=node.get('alias') or node.name) -%}
            {%- set existing = adapter.get_relation(
                database=relation.database, schema=relation.schema, identifier=relation.identifier) -%}
            {%- set full_refresh = node.config.get('full_refresh') -%}
            {%- set full_refresh = flags.FULL_REFRESH if full_refresh is none else full_refresh -%}
            {%- if existing is not none and not full_refresh -%}
                {%- set rows = query_rows_at_execution(change_positions_query(relation, positions)) -%}
                {%- do result.folds.update({node.unique_id: rows}) -%}
                {%- do per_fold.append(rows) -%}
            {%- endif -%}
        {%- endif -%}
    {%- endfor -%}
    {%- do graph.update({'changelake_change_batch': {'invocation_id': invocation_id, 'folds': result.folds}}) -%}
    {%- if not per_fold -%}
        {%- do result.update({'empty': true}) -%}
        {{ return(result) }}
    {%- endif -%}
    {#- The lower position per source stored by every fold; a source missing from one fold is left
        out (read whole), and a fold's unknown max seq (rows from snapshot pages only) reads every
        event of the source. -#}
    {%- set combined = [] -%}
    {%- for first in per_fold[0] -%}
        {%- set row = {'source': first.source, 'max_seq': first.get('max_seq'), 'max_commit_lsn': first.get('max_commit_lsn')} -%}
        {%- set found = namespace(all=true) -%}
        {%- for other_rows in per_fold[1:] -%}
            {%- set matches = other_rows | selectattr('source', 'equalto', first.source) | list -%}
            {%- if matches | length == 0 -%}
                {%- set found.all = false -%}
            {%- else -%}
                {%- set other = matches[0] -%}
                {%- do row.update({
                    'max_seq': none if row.max_seq is none or other.get('max_seq') is none
                        else [row.max_seq, other.get('max_seq')] | min,
                    'max_commit_lsn': none if row.max_commit_lsn is none or other.get('max_commit_lsn') is none
                        else [row.max_commit_lsn, other.get('max_commit_lsn')] | min,
                }) -%}
            {%- endif -%}
        {%- endfor -%}
        {%- if found.all -%}
            {%- do combined.append(row) -%}
        {%- endif -%}
    {%- endfor -%}
    {%- do result.update({'bounds': consumer_records_scan_bounds(stored_rows=combined)}) -%}
    {{ return(result) }}
{% endmacro %}
