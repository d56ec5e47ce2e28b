{% macro bronze_visible_through() %}
    {#-
        The loaded_at_query of the bronze sources: how fresh what dbt can see is. Per source, the
        commit time of the last bronze.wal_events row at or below its safe bound (the minimum over
        its writers in bronze.stream_positions) - heartbeats count, so an idle but healthy source
        stays fresh, while a writer that stopped (a stuck snapshot holding the bound back) ages it;
        the oldest over the sources, 1970-01-01 for a source with nothing visible yet. Arrival
        (ingested_at) would call fresh an event that a lagging writer keeps out of silver.
        Reads the source, commit_lsn and commit_timestamp columns of wal_events.
    -#}
    {%- set wal_events = graph.sources['source.changelake.bronze.wal_events'].relation_name -%}
    {%- set positions = graph.sources['source.changelake.bronze.stream_positions'].relation_name -%}
    select min(coalesce(visible_through, timestamp '1970-01-01 00:00:00')) as visible_through
    from (
        select
            safe_bounds.source,
            max(wal_events.commit_timestamp) as visible_through
        from ({{ safe_bounds_from_positions(positions) }}) as safe_bounds
        left join {{ wal_events }} as wal_events
            on
                safe_bounds.source = wal_events.source
                and wal_events.commit_lsn <= safe_bounds.safe_lsn
        group by safe_bounds.source
    ) as visible
{% endmacro %}
