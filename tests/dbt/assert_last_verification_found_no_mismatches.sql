-- The scheduled check of docs/verify.md: fails (one row per source) when the latest
-- `changelake-ingest verify` of one of its tables found keys missing, extra or different in
-- silver, so a scheduled `dbt build` (or `dbt test --select
-- assert_last_verification_found_no_mismatches`) alerts on it; gold verification_runs lists the
-- tables and keys. A later verify that finds the table equal clears it. It tests source_health,
-- which has no children: a failure skips nothing.
with

source_health as (

    select * from {{ ref('source_health') }}

)

select
    source,
    last_verified_at,
    tables_mismatched,
    verification_mismatches,
    tables_verified_equal
from source_health
where tables_mismatched > 0
