{% macro snapshot_rows_placed_scan_bounds() %}
    {#-
        The lookups model snapshot_rows_placed turns into literals, run before its main query is
        planned (query_rows_at_execution). Returns a dict:
        - placed_positions_query: per source the highest watermark already placed ({{ this }});
        - placed_rows: its rows, or none (a full build, parse time, unit tests);
        - new_pages_filter: a predicate on alias snapshot_pages keeping, per source, watermarks
          above the highest placed one and at or below the safe bound (none when placed_rows is none);
        - page_events_filter: a predicate on alias sequin_events keeping, per source, events at or
          below the highest watermark of those new pages, the only events that can supersede a
          page row (none when placed_rows is none; `false` when there is no new page);
        - completed_tables: the tables (rows of source, table_schema, table_name) with a
          whole-table snapshot's last page between those bounds, the only tables a snapshot can
          complete for this run (none when placed_rows is none: every table is looked at; an
          empty list: the model leaves out its search for absent keys);
        - nothing_to_place: true when there is no new page row and no such table, so the model's
          statement would append nothing: the model runs no statement (this macro calls
          changelake_request_skip for it).
        - safe_bound_rows: silver.safe_bounds' rows (source, safe_lsn), read once, or none (the
          model skipped, parse time, unit tests): the model's exact bound, as literals.
        The model's joins still decide exactly; the other literals only prune.
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
        'nothing_to_place': false,
        'safe_bound_rows': none,
    } -%}
    {#- A model skipped because nothing is new runs no lookup either (changelake_skip_reason). -#}
    {%- if is_incremental() and changelake_skip_reason() is none -%}
        {%- set placed_rows = query_rows_at_execution(placed_positions_query) -%}
        {%- if placed_rows is not none -%}
            {#- The bounds safe_bounds is built from this run (changelake_run_state), not a read of it. -#}
            {%- set current_bound_rows = changelake_run_state().current_rows -%}
            {#- New pages: above the highest placed watermark, as the model's join says (a page at
                it was placed); source_ranges' bounds are inclusive, so each range starts one above. -#}
            {%- set page_ranges = [] -%}
            {%- for range in source_ranges(current_bound_rows, 'safe_lsn', placed_rows, 'max_commit_lsn') -%}
                {%- do page_ranges.append({
                    'source': range.source,
                    'low': none if range.low is none else range.low + 1,
                    'high': range.high,
                }) -%}
            {%- endfor -%}
            {%- set new_pages_filter = source_ranges_predicate('snapshot_pages', 'high_watermark_lsn', page_ranges) -%}
            {#- One lookup: per source the highest watermark of the new page rows, and the tables
                whose whole-table snapshot's last page is among the new pages. -#}
            {%- set new_pages_query -%}
                select
                    'rows' as kind,
                    snapshot_pages.source,
                    max(snapshot_pages.high_watermark_lsn) as high,
                    cast(null as string) as table_schema,
                    cast(null as string) as table_name
                from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
                where {{ new_pages_filter }} and snapshot_pages.record_pk is not null
                group by snapshot_pages.source
                union all
                select distinct
                    'completed' as kind,
                    snapshot_pages.source,
                    cast(null as bigint) as high,
                    snapshot_pages.table_schema,
                    snapshot_pages.table_name
                from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
                where
                    {{ new_pages_filter }}
                    and snapshot_pages.last_page
                    and snapshot_pages.table_snapshot is not null
            {%- endset -%}
            {%- set new_pages = query_rows_at_execution(new_pages_query) -%}
            {%- set page_event_ranges = [] -%}
            {%- set completed_tables = [] -%}
            {%- for row in new_pages -%}
                {%- if row.kind == 'rows' -%}
                    {%- do page_event_ranges.append({'source': row.source, 'high': row.high}) -%}
                {%- else -%}
                    {%- do completed_tables.append(
                        {'source': row.source, 'table_schema': row.table_schema, 'table_name': row.table_name}) -%}
                {%- endif -%}
            {%- endfor -%}
            {%- do bounds.update({
                'placed_rows': placed_rows,
                'new_pages_filter': new_pages_filter,
                'page_events_filter': source_ranges_predicate('sequin_events', 'commit_lsn', page_event_ranges),
                'completed_tables': completed_tables,
                'nothing_to_place': not page_event_ranges and not completed_tables,
            }) -%}
            {%- if bounds.nothing_to_place -%}
                {%- do changelake_request_skip('skipped: no snapshot page became usable') -%}
            {%- endif -%}
        {%- endif -%}
    {%- endif -%}
    {#- silver.safe_bounds, read once (the model reads it at several places of its plan), when the
        model is about to run: `dbt compile`, `dbt show` or sqlfluff's templater may come before
        the table exists, and a unit test's ref is a fixture. -#}
    {%- if execute and model.resource_type != 'unit_test' and flags.WHICH in ['run', 'build', 'retry']
        and changelake_skip_reason() is none and load_relation(ref('safe_bounds')) is not none -%}
        {%- do bounds.update({'safe_bound_rows': query_rows_at_execution(
            'select source, safe_lsn from ' ~ ref('safe_bounds'))}) -%}
    {%- endif -%}
    {{ return(bounds) }}
{% endmacro %}
