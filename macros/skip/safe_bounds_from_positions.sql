{% macro safe_bounds_from_positions(stream_positions) %}
    {#-
        The SELECT of silver.safe_bounds from the positions relation `stream_positions`: per source
        min(durable_lsn) over its writers (safe_lsn), the highest durable or acknowledged position
        (max_observed_lsn), the writer count and the last position update. durable_lsn is never
        lowered, so a writer's highest row is its current one (this also holds if positions are ever
        appended rather than upserted).
    -#}
    select
        source,
        min(durable_lsn) as safe_lsn,
        max(observed_lsn) as max_observed_lsn,
        count(*) as writer_count,
        max(updated_at) as positions_updated_at
    from (
        select
            source,
            writer_id,
            max(durable_lsn) as durable_lsn,
            max(greatest(durable_lsn, coalesce(ack_lsn, durable_lsn))) as observed_lsn,
            max(updated_at) as updated_at
        from {{ stream_positions }}
        group by source, writer_id
    ) as writer_positions
    group by source
{% endmacro %}
