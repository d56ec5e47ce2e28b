-- Invariant: each gold.completeness row is one certificate that agrees with itself - the last
-- change it names is at or below the bound it certifies, which then has a commit time, and a verify
-- result is either wholly there (run, time, position, status) or wholly absent.

with

completeness as (

    select
        source,
        run_id,
        run_started_at,
        complete_through_lsn,
        complete_through_commit_at,
        last_change_seq,
        last_change_lsn,
        last_verify_run_id,
        last_verified_at,
        last_verified_position,
        verify_status,
        tables_verified,
        recorded_at
    from {{ ref('completeness') }}

),

final as (

    select
        source,
        run_id,
        run_started_at,
        complete_through_lsn,
        complete_through_commit_at,
        last_change_seq,
        last_change_lsn,
        last_verify_run_id,
        last_verified_at,
        last_verified_position,
        verify_status,
        tables_verified,
        recorded_at
    from completeness
    where
        (last_change_seq is not null and complete_through_commit_at is null)
        or (last_change_seq is null) != (last_change_lsn is null)
        or last_change_lsn > complete_through_lsn
        or (last_verify_run_id is null) != (last_verified_at is null)
        or (last_verify_run_id is null) != (verify_status is null)
        or (last_verify_run_id is null) != (tables_verified = 0)
        or recorded_at < run_started_at

)

select * from final
