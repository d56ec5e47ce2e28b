-- Invariant DESIGN §4 (dbt consumes only events at or below the safe bound): no event in silver
-- lies above its source's current safe bound (bounds are never lowered).
with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

)

select
    sequin_events.source,
    sequin_events.commit_lsn,
    sequin_events.commit_index,
    sequin_events.action
from sequin_events
left join safe_bounds
    on sequin_events.source = safe_bounds.source
where
    safe_bounds.source is null
    or sequin_events.commit_lsn > safe_bounds.safe_lsn
