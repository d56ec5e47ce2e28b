{% macro moved_toast_values(events, snapshot_rows, stored_records=none, hops=4, needed=true) %}
{#-
    CTEs ending in `moved_toast_values`: for each update of `events` (sequin_events rows) that
    changed the primary key and left TOAST columns unchanged that its old tuple lacks (the default
    replica identity sends the old key only), the old tuple completed with those columns' values
    under the old key just before the change (the row moved, its value did not change). One row
    per such event: source, table_schema, table_name, record_pk, commit_lsn, commit_index,
    old_record. The value is the one of the old key's latest earlier change in the batch that
    fixes it, in `events` or `snapshot_rows` (placed snapshot rows): its record's, or its old
    tuple's; an update in place that left the column unchanged is looked through. With no such
    change, `stored_records` (the stored rows by key, none on a full build) gives it. When that
    change is itself a row arriving with the column unchanged (the same row's key changed twice
    in the batch), the value is that arrival's: `hops` rounds follow such chains, up to hops + 1
    key changes of one row in one batch. A longer chain, or a value nobody has, stays missing and
    the fold flags the record needs_reread.
    Each round joins the first round's rows, not the previous round's twice: Spark inlines CTEs,
    so pointer jumping (a self-join per round) would plan 2^hops copies of the batch's scans.
    With needed false (the caller knows the batch holds no such update: macro
    consumer_records_scan_bounds, moves_toast), moved_toast_values is an empty relation of the
    same columns and no other CTE is planned.
-#}
{%- if not needed %}
moved_toast_values as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        commit_index,
        old_record
    from {{ events }}
    where false

)
{%- else %}
{%- set map_type = "'map<string, variant>'" -%}
{%- set column_value = "from_json(earlier.record, " ~ map_type ~ ")[moved_toast_columns.column_name]" -%}
{%- set old_value = "from_json(earlier.old_record, " ~ map_type ~ ")[moved_toast_columns.column_name]" -%}
moved_toast_columns as (

    -- One row per arriving row and unchanged TOAST column its old tuple does not carry (a null
    -- there is a column the old tuple left out: a TOASTed value is never null).
    select
        arrivals.source,
        arrivals.table_schema,
        arrivals.table_name,
        arrivals.record_pk,
        arrivals.old_record_pk,
        arrivals.commit_lsn,
        arrivals.commit_index,
        arrivals.old_record,
        moved.column_name
    from {{ events }} as arrivals
        lateral view explode(arrivals.unchanged_toast) moved as column_name
    where
        arrivals.action = 'update'
        and arrivals.old_record_pk is not null
        and arrivals.old_record_pk != arrivals.record_pk
        and (
            from_json(arrivals.old_record, {{ map_type }})[moved.column_name] is null
            or is_variant_null(from_json(arrivals.old_record, {{ map_type }})[moved.column_name])
        )

),

moved_toast_earlier_changes as (

    -- The rows a key held: inserts, updates (new key) and placed snapshot rows.
    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        commit_index,
        record,
        old_record,
        unchanged_toast,
        coalesce(old_record_pk != record_pk, false) as is_arrival
    from {{ events }}
    where action in ('insert', 'update')
    union all
    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        commit_index,
        record,
        cast(null as string) as old_record,
        cast(array() as array<string>) as unchanged_toast,
        false as is_arrival
    from {{ snapshot_rows }}
    where record is not null

),

moved_toast_sources as (

    -- The old key's earlier changes that fix the column: one with its value, or one that brought
    -- a row onto the old key with the column unchanged and not in its old tuple (is_moved: its
    -- value is that row's, a moved_toast_columns row itself); recency 1 is the latest (or none).
    select
        moved_toast_columns.*,
        earlier.commit_lsn as from_lsn,
        earlier.commit_index as from_index,
        coalesce(
            {{ column_value }}, case when not is_variant_null({{ old_value }}) then {{ old_value }} end
        ) as column_value,
        row_number() over (
            partition by
                moved_toast_columns.source,
                moved_toast_columns.table_schema,
                moved_toast_columns.table_name,
                moved_toast_columns.record_pk,
                moved_toast_columns.commit_lsn,
                moved_toast_columns.commit_index,
                moved_toast_columns.column_name
            order by earlier.commit_lsn desc, earlier.commit_index desc
        ) as recency
    from moved_toast_columns
    left join moved_toast_earlier_changes as earlier
        on
            moved_toast_columns.source = earlier.source
            and moved_toast_columns.table_schema = earlier.table_schema
            and moved_toast_columns.table_name = earlier.table_name
            and moved_toast_columns.old_record_pk = earlier.record_pk
            and (
                earlier.commit_lsn < moved_toast_columns.commit_lsn
                or (
                    earlier.commit_lsn = moved_toast_columns.commit_lsn
                    and earlier.commit_index < moved_toast_columns.commit_index
                )
            )
            and (
                {{ column_value }} is not null
                or ({{ old_value }} is not null and not is_variant_null({{ old_value }}))
                or (earlier.is_arrival and array_contains(earlier.unchanged_toast, moved_toast_columns.column_name))
            )

),

moved_toast_hop_0 as (

    -- A value found, or where to find it: the arrival (from_pk, from_lsn, from_index) whose
    -- value it is. Without an earlier change in the batch, the old key's stored record.
    select
        sources.source,
        sources.table_schema,
        sources.table_name,
        sources.record_pk,
        sources.commit_lsn,
        sources.commit_index,
        sources.old_record,
        sources.column_name,
        sources.from_lsn is null or sources.column_value is not null as is_resolved,
        {% if stored_records is none %}
            sources.column_value,
        {% else %}
            case
                when sources.from_lsn is not null then sources.column_value
                else from_json(stored.record, {{ map_type }})[sources.column_name]
            end as column_value,
        {% endif %}
        case when sources.column_value is null then sources.old_record_pk end as from_pk,
        case when sources.column_value is null then sources.from_lsn end as from_lsn,
        case when sources.column_value is null then sources.from_index end as from_index
    from moved_toast_sources as sources
    {% if stored_records is not none %}
        left join {{ stored_records }} as stored
            on
                sources.source = stored.source
                and sources.table_schema = stored.table_schema
                and sources.table_name = stored.table_name
                and sources.old_record_pk = stored.record_pk
    {% endif %}
    where sources.recency = 1

),
{% for hop in range(1, hops + 1) %}

moved_toast_hop_{{ hop }} as (

    -- One more key change back: a pending value takes the value of the arrival it comes from
    -- when that one's is found, else points where that one points.
    select
        pending.source,
        pending.table_schema,
        pending.table_name,
        pending.record_pk,
        pending.commit_lsn,
        pending.commit_index,
        pending.old_record,
        pending.column_name,
        pending.is_resolved or coalesce(pointed.is_resolved, false) as is_resolved,
        case when pending.is_resolved then pending.column_value else pointed.column_value end as column_value,
        case when not pending.is_resolved then pointed.from_pk end as from_pk,
        case when not pending.is_resolved then pointed.from_lsn end as from_lsn,
        case when not pending.is_resolved then pointed.from_index end as from_index
    from moved_toast_hop_{{ hop - 1 }} as pending
    left join moved_toast_hop_0 as pointed
        on
            pending.source = pointed.source
            and pending.table_schema = pointed.table_schema
            and pending.table_name = pointed.table_name
            and pending.from_pk = pointed.record_pk
            and pending.from_lsn = pointed.commit_lsn
            and pending.from_index = pointed.commit_index
            and pending.column_name = pointed.column_name

),
{% endfor %}

moved_toast_found as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        commit_index,
        first(old_record) as old_record,
        map_from_entries(collect_list(struct(column_name, column_value))) as moved_values
    from moved_toast_hop_{{ hops }}
    where is_resolved and column_value is not null
    group by source, table_schema, table_name, record_pk, commit_lsn, commit_index

),

moved_toast_values as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        commit_index,
        to_json(map_concat(
            map_filter(
                coalesce(from_json(old_record, {{ map_type }}), cast(map() as map<string, variant>)),
                (old_name, old_value) -> not array_contains(map_keys(moved_values), old_name)
            ),
            moved_values
        )) as old_record
    from moved_toast_found

)
{%- endif %}
{%- endmacro %}
