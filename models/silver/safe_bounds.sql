{{ config(materialized='table') }}

-- One row per source: the position below which bronze is complete (DESIGN §4). Materialised once
-- per run so that every model of the run reads the same bound, however far ingest moves meanwhile.

with

stream_positions as (

    select * from {{ source('bronze', 'stream_positions') }}

),

writer_positions as (

    -- durable_lsn is never lowered, so a writer's highest row is its current one (this also holds
    -- if positions are ever appended rather than upserted).
    select
        source,
        writer_id,
        max(durable_lsn) as durable_lsn,
        max(greatest(durable_lsn, coalesce(ack_lsn, durable_lsn))) as observed_lsn,
        max(updated_at) as updated_at
    from stream_positions
    group by source, writer_id

),

final as (

    select
        source,
        min(durable_lsn) as safe_lsn,
        max(observed_lsn) as max_observed_lsn,
        count(*) as writer_count,
        max(updated_at) as positions_updated_at
    from writer_positions
    group by source

)

select * from final
