{% macro snapshot_rows_placed_scan_bounds() %}
    {#-
        The lookups model snapshot_rows_placed turns into literals, run before its main query is
        planned (query_rows_at_execution). Returns a dict:
        - placed_positions_query: per source the highest watermark already placed ({{ this }});
        - placed_rows: its rows, or none (a full build, parse time, unit tests);
        - new_pages_filter: a predicate on alias snapshot_pages keeping, per source, watermarks
          between the highest placed one and the safe bound (none when placed_rows is none);
        - page_events_filter: a predicate on alias sequin_events keeping, per source, events at or
          below the highest watermark of those new pages, the only events that can supersede a
          page row (none when placed_rows is none; `false` when there is no new page);
        - completed_tables: the tables (rows of source, table_schema, table_name) with a
          whole-table snapshot's last page between those bounds, the only tables a snapshot can
          complete for this run (none when placed_rows is none: every table is looked at; an
          empty list: the model leaves out its search for absent keys).
        The model's joins still decide exactly; the literals only prune.
    -#}
    {%- set placed_positions_query -%}
        select
            source,
            max(commit_lsn) as max_commit_lsn
        from {{ this }}
        group by source
    {%- endset -%}
    {%- set bounds = {
        'placed_positions_query': placed_positions_query,
        'placed_rows': none,
        'new_pages_filter': none,
        'page_events_filter': none,
        'completed_tables': none,
    } -%}
    {#- A model skipped because nothing is new runs no lookup either (changelake_skip_reason). -#}
    {%- if is_incremental() and changelake_skip_reason() is none -%}
        {%- set placed_rows = query_rows_at_execution(placed_positions_query) -%}
        {%- if placed_rows is not none -%}
            {#- The bounds safe_bounds is built from this run (changelake_run_state), not a read of it. -#}
            {%- set safe_bound_rows = changelake_run_state().current_rows -%}
            {%- set page_ranges = source_ranges(safe_bound_rows, 'safe_lsn', placed_rows, 'max_commit_lsn') -%}
            {%- set new_pages_filter = source_ranges_predicate('snapshot_pages', 'high_watermark_lsn', page_ranges) -%}
            {%- set page_bounds_query -%}
                select snapshot_pages.source, max(snapshot_pages.high_watermark_lsn) as high
                from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
                where {{ new_pages_filter }} and snapshot_pages.record_pk is not null
                group by snapshot_pages.source
            {%- endset -%}
            {%- set page_event_ranges = query_rows_at_execution(page_bounds_query) -%}
            {%- set completed_tables_query -%}
                select distinct snapshot_pages.source, snapshot_pages.table_schema, snapshot_pages.table_name
                from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
                where
                    {{ new_pages_filter }}
                    and snapshot_pages.last_page
                    and snapshot_pages.table_snapshot is not null
            {%- endset -%}
            {%- do bounds.update({
                'placed_rows': placed_rows,
                'new_pages_filter': new_pages_filter,
                'page_events_filter': source_ranges_predicate('sequin_events', 'commit_lsn', page_event_ranges),
                'completed_tables': query_rows_at_execution(completed_tables_query),
            }) -%}
        {%- endif -%}
    {%- endif -%}
    {{ return(bounds) }}
{% endmacro %}
