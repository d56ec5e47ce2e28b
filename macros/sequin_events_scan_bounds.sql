{% macro sequin_events_scan_bounds() %}
    {#-
        The lookups model sequin_events turns into literals, run before its main query is planned
        (query_rows_at_execution), so that Delta skips the bronze files outside each source's
        (loaded position, safe bound] window. Returns a dict:
        - loaded_positions_query: per source the max seq and the position of that event in {{ this }};
        - loaded_rows: its rows, or none (a full build, parse time, unit tests);
        - wal_events_filter: a predicate on alias wal_events bounding commit_lsn per source by the
          loaded position and the safe bound, or none when loaded_rows is none.
        The model's joins still decide exactly; the literals only prune.
    -#}
    {%- set loaded_positions_query -%}
        select
            source,
            max(seq) as max_seq,
            max_by(commit_lsn, seq) as max_commit_lsn,
            max_by(commit_index, seq) as max_commit_index
        from {{ this }}
        group by source
    {%- endset -%}
    {%- set bounds = {'loaded_positions_query': loaded_positions_query, 'loaded_rows': none, 'wal_events_filter': none} -%}
    {#- A model skipped because nothing is new runs no lookup either (changelake_skip_reason). -#}
    {%- if is_incremental() and changelake_skip_reason() is none -%}
        {%- set loaded_rows = query_rows_at_execution(loaded_positions_query) -%}
        {%- if loaded_rows is not none -%}
            {#- The bounds safe_bounds is built from this run (changelake_run_state), not a read of it. -#}
            {%- set safe_bound_rows = changelake_run_state().current_rows -%}
            {%- set scan_ranges = source_ranges(safe_bound_rows, 'safe_lsn', loaded_rows, 'max_commit_lsn') -%}
            {%- do bounds.update({
                'loaded_rows': loaded_rows,
                'wal_events_filter': source_ranges_predicate('wal_events', 'commit_lsn', scan_ranges),
            }) -%}
        {%- endif -%}
    {%- endif -%}
    {{ return(bounds) }}
{% endmacro %}
