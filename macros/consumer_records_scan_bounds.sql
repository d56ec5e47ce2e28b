{% macro consumer_records_scan_bounds(stored_positions_query=none, batch=none, stored_rows=none) %}
    {#-
        The lookups model consumer_records turns into literals, run before its main query is
        planned (query_rows_at_execution), so that Delta skips the sequin_events files already
        folded, the snapshot rows already folded and the stored partitions the run does not touch.
        record_history passes its own stored_positions_query (same columns: source, max_seq,
        max_commit_lsn). Returns a dict:
        - stored_positions_query: the caller's query of its stored max seq and max commit_lsn per
          source (consumer_records and record_history pass one; model record_changes passes its
          stored_rows instead and gets none);
        - stored_rows: its rows, or none (a full build, parse time, unit tests);
        and, when stored_rows is not none:
        - stored_sources_events_filter / other_sources_events_filter: predicates on alias
          sequin_events keeping the events above the stored max seq of a source with stored rows /
          the events of every other source;
        - stored_sources_snapshot_rows_filter / other_sources_snapshot_rows_filter: predicates on
          alias snapshot_rows_placed keeping the rows at or above the stored max commit_lsn of a
          source with stored rows / the rows of every other source;
        - touched_partitions: the (source, table_schema, table_name) the run changes: tables of new
          events, truncated tables, tables of new snapshot rows; with moves_toast, whether a new
          event of that table changed a primary key and left TOAST columns unchanged.
        and always:
        - moves_toast: false when the run's new events hold no primary-key change that left TOAST
          columns unchanged, so the model can leave macro moved_toast_values' CTEs out of its plan
          (they are the largest part of it, and Spark plans them even when they find nothing);
          true when there is one, or when it cannot be known (parse time, unit tests).
        The model's joins still decide exactly; the literals only prune.
        Two other callers:
        - a fold reading the run's change batch (`batch`, from macro
          changelake_reads_change_batch: its stored positions come with it) gets batch_filter: the
          exact predicate on alias change_batch keeping the batch rows it has not folded (a
          change above its stored position); touched_partitions and moves_toast then come from
          those batch rows, not from a scan of sequin_events;
        - model record_changes passes `stored_rows` (the lower of the folds' positions per source,
          macro record_changes_scan_bounds) and gets the literal filters only.
    -#}
    {%- set moves_toast_condition -%}
        action = 'update'
        and old_record_pk is not null
        and old_record_pk != record_pk
        and size(unchanged_toast) > 0
    {%- endset -%}
    {%- set bounds = {'stored_positions_query': stored_positions_query, 'stored_rows': none, 'moves_toast': true} -%}
    {#- A model skipped because nothing is new runs no lookup either (changelake_skip_reason). -#}
    {%- if is_incremental() and changelake_skip_reason() is not none -%}
        {{ return(bounds) }}
    {%- endif -%}
    {%- set given_rows = stored_rows -%}
    {%- if given_rows is not none -%}
        {%- set stored_rows = given_rows -%}
    {%- elif batch is not none -%}
        {%- set stored_rows = batch.stored_rows -%}
    {%- else -%}
        {%- set stored_rows = query_rows_at_execution(stored_positions_query)
            if is_incremental() and stored_positions_query is not none else none -%}
    {%- endif -%}
    {%- if stored_rows is none -%}
        {#- A full build reads every event: one look for a key change with unchanged TOAST, when
            the model is about to run (`dbt compile` or `dbt show` may come before sequin_events
            exists). -#}
        {%- set moves_toast_rows = none if flags.WHICH not in ['run', 'build', 'retry'] else query_rows_at_execution(
            'select 1 as found from ' ~ ref('sequin_events') ~ ' where ' ~ moves_toast_condition ~ ' limit 1') -%}
        {%- if moves_toast_rows is not none -%}
            {%- do bounds.update({'moves_toast': moves_toast_rows | length > 0}) -%}
        {%- endif -%}
        {{ return(bounds) }}
    {%- endif -%}

    {%- set event_ranges = [] -%}
    {%- set snapshot_row_ranges = [] -%}
    {%- for stored in stored_rows -%}
        {#- seq is unique: the first unfolded event is max_seq + 1 (an inclusive max_seq would keep
            every file holding the last folded event). -#}
        {%- do event_ranges.append({
            'source': stored.source,
            'low': stored.max_seq + 1 if stored.get('max_seq') is not none else none,
            'high': none,
        }) -%}
        {%- do snapshot_row_ranges.append({
            'source': stored.source, 'low': stored.get('max_commit_lsn'), 'high': none,
        }) -%}
    {%- endfor -%}
    {%- set stored_sources_events_filter = source_ranges_predicate('sequin_events', 'seq', event_ranges) -%}
    {%- set other_sources_events_filter = 'not ' ~ partitions_predicate('sequin_events', ['source'], stored_rows) -%}
    {%- set stored_sources_snapshot_rows_filter = source_ranges_predicate(
        'snapshot_rows_placed', 'commit_lsn', snapshot_row_ranges) -%}
    {%- set other_sources_snapshot_rows_filter = 'not ' ~ partitions_predicate(
        'snapshot_rows_placed', ['source'], stored_rows) -%}
    {%- do bounds.update({
        'stored_rows': stored_rows,
        'stored_sources_events_filter': stored_sources_events_filter,
        'other_sources_events_filter': other_sources_events_filter,
        'stored_sources_snapshot_rows_filter': stored_sources_snapshot_rows_filter,
        'other_sources_snapshot_rows_filter': other_sources_snapshot_rows_filter,
    }) -%}
    {%- if given_rows is not none -%}
        {{ return(bounds) }}
    {%- endif -%}
    {%- if batch is not none -%}
        {#- Exact: a change above the fold's stored position of its source (an event above the max
            seq, a snapshot or absent row above the max commit_lsn), or any change of a source it has not
            stored. -#}
        {%- set alternatives = [] -%}
        {%- for stored in stored_rows -%}
            {%- do alternatives.append(
                '(change_batch.source = ' ~ sql_literal(stored.source)
                ~ " and case when change_batch.change_kind in ('snapshot', 'absent') then change_batch.commit_lsn > "
                ~ sql_literal(stored.get('max_commit_lsn'), 'bigint')
                ~ ' else change_batch.seq > ' ~ sql_literal(stored.get('max_seq', 0), 'bigint') ~ ' end)') -%}
        {%- endfor -%}
        {%- do alternatives.append('not ' ~ partitions_predicate('change_batch', ['source'], stored_rows)) -%}
        {%- set batch_filter = '(' ~ alternatives | join(' or ') ~ ')' -%}
        {%- set touched_partitions = query_rows_at_execution(
            'select change_batch.source, change_batch.table_schema, change_batch.table_name, bool_or(coalesce('
            ~ "change_batch.change_kind = 'upsert' and change_batch.change_action = 'update'"
            ~ ' and change_batch.old_record_pk is not null and change_batch.old_record_pk != change_batch.record_pk'
            ~ ' and size(change_batch.unchanged_toast) > 0, false)) as moves_toast from '
            ~ batch.relation ~ ' as change_batch where ' ~ batch_filter
            ~ ' group by change_batch.source, change_batch.table_schema, change_batch.table_name') -%}
        {%- do bounds.update({
            'batch_filter': batch_filter,
            'touched_partitions': touched_partitions,
            'moves_toast': touched_partitions | selectattr('moves_toast') | list | length > 0,
        }) -%}
        {{ return(bounds) }}
    {%- endif -%}
    {%- set touched_partitions_query -%}
        with new_events as (
            select
                source, table_schema, table_name, action, truncated_tables,
                coalesce({{ moves_toast_condition }}, false) as moves_toast
            from {{ ref('sequin_events') }} as sequin_events
            where {{ stored_sources_events_filter }}
            union all
            select
                source, table_schema, table_name, action, truncated_tables,
                coalesce({{ moves_toast_condition }}, false) as moves_toast
            from {{ ref('sequin_events') }} as sequin_events
            where {{ other_sources_events_filter }}
        ),
        new_snapshot_rows as (
            select source, table_schema, table_name, is_superseded
            from {{ ref('snapshot_rows_placed') }} as snapshot_rows_placed
            where {{ stored_sources_snapshot_rows_filter }}
            union all
            select source, table_schema, table_name, is_superseded
            from {{ ref('snapshot_rows_placed') }} as snapshot_rows_placed
            where {{ other_sources_snapshot_rows_filter }}
        ),
        touched as (
            select new_events.source, new_events.table_schema, new_events.table_name, new_events.moves_toast
            from new_events
            where new_events.action != 'truncate'
            union all
            select new_events.source, {{ truncated_table_parts('truncated.truncated_table') }}, false as moves_toast
            from new_events
                lateral view explode(new_events.truncated_tables) truncated as truncated_table
            where new_events.action = 'truncate'
            union all
            select
                new_snapshot_rows.source,
                new_snapshot_rows.table_schema,
                new_snapshot_rows.table_name,
                false as moves_toast
            from new_snapshot_rows
            where not new_snapshot_rows.is_superseded
        )
        select source, table_schema, table_name, bool_or(moves_toast) as moves_toast
        from touched
        group by source, table_schema, table_name
    {%- endset -%}
    {%- set touched_partitions = query_rows_at_execution(touched_partitions_query) -%}
    {%- do bounds.update({
        'touched_partitions': touched_partitions,
        'moves_toast': touched_partitions | selectattr('moves_toast') | list | length > 0,
    }) -%}
    {{ return(bounds) }}
{% endmacro %}
