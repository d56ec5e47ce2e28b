{{ config(materialized='changelake_table', skip_when='positions_unchanged') }}

-- Not rewritten when bronze.stream_positions is what the last run read (skip_when): ingest writes
-- relation shapes and snapshot pages before it raises a position, so they are unchanged too.
-- Built after safe_bounds (depends_on below), which reads the positions once for the invocation
-- (changelake_run_state); started beside it, with threads > 1, each read them again.
-- depends_on: {{ ref('safe_bounds') }}

-- One row per table snapshot that is running (its writer is in bronze.stream_positions) or
-- completed (its last page is in bronze.snapshot_pages): the snapshot writers' progress token
-- (stream_positions.resume_token of a snapshot writer, docs/snapshots.md) parsed once, here.
-- Materialised once per run, like safe_bounds.

with

stream_positions as (

    select * from {{ source('bronze', 'stream_positions') }}

),

snapshot_pages as (

    select * from {{ source('bronze', 'snapshot_pages') }}

),

snapshot_writers as (

    -- A writer's highest row is its current one (positions are upserted; this also holds if they
    -- are ever appended).
    select
        source,
        writer_id,
        resume_token,
        updated_at
    from stream_positions
    where writer_kind = 'snapshot'
    qualify
        row_number() over (
            partition by source, writer_id
            order by durable_lsn desc, updated_at desc
        ) = 1

),

running_snapshots as (

    -- The token is {table, snapshot_id, pages, rows, estimated_rows, rows_per_s, ...}; MongoDB
    -- writers leave out the estimate and the rate.
    select
        source,
        writer_id,
        updated_at,
        from_json(
            resume_token,
            'struct<`table`: string, snapshot_id: string, pages: bigint, `rows`: bigint,
                estimated_rows: bigint, rows_per_s: double>'
        ) as progress
    from snapshot_writers

),

completed_snapshots as (

    select distinct
        source,
        snapshot_id,
        concat(table_schema, '.', table_name) as snapshot_table
    from snapshot_pages
    where last_page

),

final as (

    select
        -- The contract's column name, which sparksql lists as a keyword.
        coalesce(running_snapshots.source, completed_snapshots.source) as source,  -- noqa: RF04
        coalesce(running_snapshots.progress.snapshot_id, completed_snapshots.snapshot_id) as snapshot_id,
        coalesce(running_snapshots.progress['table'], completed_snapshots.snapshot_table) as snapshot_table,
        running_snapshots.writer_id,
        running_snapshots.source is not null as is_running,
        completed_snapshots.source is not null as is_completed,
        running_snapshots.progress.pages as pages_read,
        running_snapshots.progress.rows as rows_read,
        running_snapshots.progress.estimated_rows,
        running_snapshots.progress.rows_per_s,
        running_snapshots.updated_at as progress_updated_at
    from running_snapshots
    full outer join completed_snapshots
        on
            running_snapshots.source = completed_snapshots.source
            and running_snapshots.progress.snapshot_id = completed_snapshots.snapshot_id

)

select * from final
