{% macro changelake_nothing_between(current_rows, loaded_rows) %}
    {#-
        Whether bronze holds no change event and no snapshot page row between each source's loaded
        bound (exclusive) and its current bound (inclusive); false when a source is new or a bound
        went back. One query; the position ranges are literals, so Delta reads only the files whose
        commit_lsn / high_watermark_lsn statistics overlap them.
    -#}
    {%- if current_rows | length != loaded_rows | length or not current_rows -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set ranges = [] -%}
    {%- for current in current_rows -%}
        {%- set loaded = loaded_rows | selectattr('source', 'equalto', current.source) | list -%}
        {%- if loaded | length != 1 or loaded[0].get('safe_lsn') is none or current.get('safe_lsn') is none
            or current.safe_lsn < loaded[0].safe_lsn -%}
            {{ return(false) }}
        {%- endif -%}
        {%- if current.safe_lsn > loaded[0].safe_lsn -%}
            {%- do ranges.append({'source': current.source, 'low': loaded[0].safe_lsn + 1, 'high': current.safe_lsn}) -%}
        {%- endif -%}
    {%- endfor -%}
    {%- set wal_events = graph.sources['source.changelake.bronze.wal_events'].relation_name -%}
    {%- set snapshot_pages = graph.sources['source.changelake.bronze.snapshot_pages'].relation_name -%}
    {%- set query -%}
        select wal_events.source
        from {{ wal_events }} as wal_events
        where
            {{ source_ranges_predicate('wal_events', 'commit_lsn', ranges) }}
            and wal_events.action in ('insert', 'update', 'delete', 'truncate')
        union all
        select snapshot_pages.source
        from {{ snapshot_pages }} as snapshot_pages
        where
            {{ source_ranges_predicate('snapshot_pages', 'high_watermark_lsn', ranges) }}
            and snapshot_pages.record_pk is not null
        limit 1
    {%- endset -%}
    {{ return(query_rows_at_execution(query) | length == 0) }}
{% endmacro %}
