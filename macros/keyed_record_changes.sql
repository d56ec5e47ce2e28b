{% macro keyed_record_changes(changes, stored_records=none, moves_toast=true, events=none, snapshot_rows=none) %}
{#-
    CTEs ending in `all_changes`: a fold's changes, one row per key and change, from `changes`
    (rows of macro record_change_rows: model record_changes, or the fold's own inlined batch) and
    the fold's stored rows by key (`stored_records`: consumer_records' rows, record_history's open
    versions; none on a full build). Columns: source, table_schema, table_name, record_pk,
    change_kind, commit_lsn, commit_index, seq, commit_timestamp, record, old_record,
    unchanged_toast, occupancy_delta, change_action.
    - An upsert's old tuple is completed with the values of the unchanged TOAST columns a
      primary-key change moved (macro moved_toast_values; with moves_toast false the caller knows
      the batch holds no such change and those CTEs are left out of the plan).
    - A truncate is an event for every key of its table: the keys changed in the batch and the
      keys stored (a fold's stored rows differ, so each fold expands it).
    A fold that derived `changes` itself from `events` (sequin_events rows) and `snapshot_rows`
    (placed rows) passes them too: moved_toast_values and the truncates then read them directly.
    Spark inlines every CTE at each reference, and the moved-TOAST hops reference their input many
    times: over the inlined change log (a union of four branches) the plan of a unit test grew
    past the driver's heap.
-#}
{%- if events is none %}
change_upserts as (  -- noqa: ST03

    select
        {{ changes }}.*,
        {{ changes }}.change_action as action
    from {{ changes }}
    where {{ changes }}.change_kind = 'upsert'

),

change_snapshot_rows as (  -- noqa: ST03

    select *
    from {{ changes }}
    where change_kind = 'snapshot'

),

{{ moved_toast_values('change_upserts', 'change_snapshot_rows', stored_records, needed=moves_toast) }},
{%- else %}
{{ moved_toast_values(events, snapshot_rows, stored_records, needed=moves_toast) }},
{%- endif %}

keyed_changes as (

    select
        keyed.source,
        keyed.table_schema,
        keyed.table_name,
        keyed.record_pk,
        keyed.change_kind,
        keyed.commit_lsn,
        keyed.commit_index,
        keyed.seq,
        keyed.commit_timestamp,
        keyed.record,
        coalesce(moved_toast_values.old_record, keyed.old_record) as old_record,
        keyed.unchanged_toast,
        keyed.occupancy_delta,
        keyed.change_action
    from {{ changes }} as keyed
    left join moved_toast_values
        on
            keyed.source = moved_toast_values.source
            and keyed.record_pk = moved_toast_values.record_pk
            and keyed.commit_lsn = moved_toast_values.commit_lsn
            and keyed.commit_index = moved_toast_values.commit_index
            and keyed.change_kind = 'upsert'
    where keyed.change_kind != 'truncate'

),

truncates as (

    {% if events is none %}
        select
            source,
            table_schema,
            table_name,
            commit_lsn,
            commit_index,
            seq,
            commit_timestamp
        from {{ changes }}
        where change_kind = 'truncate'
    {% else %}
        select
            truncating.source,
            {{ truncated_table_parts('truncated.truncated_table') }},
            truncating.commit_lsn,
            truncating.commit_index,
            truncating.seq,
            truncating.commit_timestamp
        from {{ events }} as truncating
            lateral view explode(truncating.truncated_tables) truncated as truncated_table
        where truncating.action = 'truncate'
    {% endif %}

),

-- ST03 is excluded here: only an incremental run (which has stored rows) reads this CTE.
truncated_tables as (  -- noqa: ST03

    select distinct
        source,
        table_schema,
        table_name
    from truncates

),

truncated_keys as (

    select distinct
        source,
        table_schema,
        table_name,
        record_pk
    from keyed_changes
    {% if stored_records is not none %}
        union
        select
            stored.source,
            stored.table_schema,
            stored.table_name,
            stored.record_pk
        from {{ stored_records }} as stored
        inner join truncated_tables
            on
                stored.source = truncated_tables.source
                and stored.table_schema = truncated_tables.table_schema
                and stored.table_name = truncated_tables.table_name
    {% endif %}

),

truncate_changes as (

    select
        truncates.source,
        truncates.table_schema,
        truncates.table_name,
        truncated_keys.record_pk,
        'truncate' as change_kind,
        truncates.commit_lsn,
        truncates.commit_index,
        truncates.seq,
        truncates.commit_timestamp,
        cast(null as string) as record,
        cast(null as string) as old_record,
        cast(array() as array<string>) as unchanged_toast,
        0 as occupancy_delta,
        'truncate' as change_action
    from truncates
    inner join truncated_keys
        on
            truncates.source = truncated_keys.source
            and truncates.table_schema = truncated_keys.table_schema
            and truncates.table_name = truncated_keys.table_name

),

all_changes as (

    select * from keyed_changes
    union all
    select * from truncate_changes

)
{%- endmacro %}
