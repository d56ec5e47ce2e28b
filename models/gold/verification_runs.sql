{{ config(skip_when='inputs_unchanged') }}

-- One row per table per `changelake-ingest verify` run (docs/verify.md), with whether it is the
-- table's latest verification; source_health summarises the latest ones. Rebuilt only when
-- bronze.verification_runs got a commit since the last build (skip_when).

with

verification_runs as (

    select * from {{ source('bronze', 'verification_runs') }}

),

ranked as (

    select
        *,
        row_number() over (
            partition by source, table_schema, table_name
            order by finished_at desc, run_id desc
        ) as run_rank
    from verification_runs

),

final as (

    select
        source,
        run_id,
        table_schema,
        table_name,
        status,
        reason,
        position,
        silver_position,
        ranges,
        mismatched_ranges,
        unresolved_ranges,
        source_rows,
        silver_rows,
        skipped_keys,
        missing,
        extra,
        different,
        missing + extra + different as mismatches,
        details,
        started_at,
        finished_at,
        run_rank = 1 as is_latest
    from ranked

)

select * from final
