{{ config(materialized='changelake_table', skip_when='positions_unchanged') }}

-- One row per source: the position below which bronze is complete (DESIGN §4). Materialised once
-- per run so that every model of the run reads the same bound, however far ingest moves meanwhile.
-- When the run runs (not at parse time or in unit tests), the rows are those changelake_run_state
-- read from the positions to decide what the run does, as literals, so the decision and the bound
-- agree; the table is not rewritten when the positions are unchanged (skip_when).

{%- set run_state = changelake_run_state() %}

{% if run_state is none %}

    with

    stream_positions as (

        select * from {{ source('bronze', 'stream_positions') }}

    ),

    final as (

        {{ safe_bounds_from_positions('stream_positions') }}

    )

    select * from final

{% else %}

    with

    final as (

        {{ safe_bounds_rows(run_state.current_rows) }}

    )

    select * from final

{% endif %}
