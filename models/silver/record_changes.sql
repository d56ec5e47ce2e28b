{{
    config(
        materialized='changelake_table',
        skip_when='nothing_new',
    )
}}

-- The change log of this run, computed once and folded by both consumer_records and record_history
-- (the models that ref it): one row per change of a key (macro record_change_rows), for every event
-- and surviving placed snapshot row above the lower of the two folds' stored positions. Rewritten
-- by every run that has something new; a fold reads it only when it was computed in the same
-- invocation for that fold's incremental run (macro changelake_reads_change_batch), and keeps the
-- rows above its own stored position. A full build of a fold reads sequin_events itself.

{%- set batch = record_changes_scan_bounds() %}
{%- set bounds = batch.bounds %}

with

{{ change_log_ctes(none, bounds, bounds.stored_rows is not none, empty=batch.empty) }}

select * from record_changes
