{{
    config(
        unique_key=['source', 'table_schema', 'table_name', 'record_pk'],
        incremental_strategy='merge',
        merge_guard=['commit_lsn', 'commit_index'],
        merge_prune_by=['source', 'table_schema', 'table_name'],
        partition_by=['source', 'table_schema', 'table_name'],
        tblproperties={'delta.enableDeletionVectors': 'true'},
        post_hook="drop table if exists {{ this }}__dbt_batch",
    )
}}

-- One row per source record: its state after the last event for its key in position order
-- (DESIGN §6), snapshot page rows included where DESIGN §5 places them. Each run folds the new
-- events and the newly usable page rows of every touched key, in position order, over the key's
-- current row; the result is merged with a position guard (macro guarded_merge_sql).

{% if is_incremental() %}
    {#- Where each source stands and which partitions this run touches, looked up before the main
        query is planned: as literals they let Delta skip the already folded sequin_events files,
        the placed snapshot pages and the stored partitions the batch does not touch (the joins
        below still decide exactly). Parse time and unit tests keep the plain queries. -#}
    {%- set stored_positions_query -%}
        -- Every applied event left its seq on some row, so events up to the source's max seq here
        -- are folded in. A page whose watermark is at or below the max stored position was under
        -- the safe bound of an earlier run, so it was placed then.
        select
            source,
            max(seq) as max_seq,
            max(commit_lsn) as max_commit_lsn
        from {{ this }}
        group by source
    {%- endset -%}
    {%- set stored_rows = query_rows_at_execution(stored_positions_query) -%}
    {%- set safe_bound_rows = query_rows_at_execution('select source, safe_lsn from ' ~ ref('safe_bounds')) -%}
    {%- if stored_rows is not none -%}
        {%- set event_ranges = [] -%}
        {%- for stored in stored_rows -%}
            {#- seq is unique: the first unfolded event is max_seq + 1 (an inclusive max_seq would
                keep every file holding the last folded event). -#}
            {%- do event_ranges.append({
                'source': stored.source,
                'low': stored.max_seq + 1 if stored.get('max_seq') is not none else none,
                'high': none,
            }) -%}
        {%- endfor -%}
        {%- set page_ranges = [] -%}
        {%- for bound in safe_bound_rows -%}
            {%- set stored = (stored_rows | selectattr('source', 'equalto', bound.source) | list) -%}
            {%- do page_ranges.append({
                'source': bound.source,
                'low': stored[0].get('max_commit_lsn') if stored else none,
                'high': bound.get('safe_lsn'),
            }) -%}
        {%- endfor -%}
        {#- New events of a source with stored rows (seq above its max) / of any other source. -#}
        {%- set stored_source_events_filter = source_ranges_predicate('sequin_events', 'seq', event_ranges) -%}
        {%- set other_source_events_filter = 'not ' ~ partitions_predicate('sequin_events', ['source'], stored_rows) -%}
        {%- set new_pages_filter = source_ranges_predicate('snapshot_pages', 'high_watermark_lsn', page_ranges) -%}
        {%- set touched_partitions_query -%}
            with new_events as (
                select source, table_schema, table_name, action, truncated_tables
                from {{ ref('sequin_events') }} as sequin_events
                where {{ stored_source_events_filter }}
                union all
                select source, table_schema, table_name, action, truncated_tables
                from {{ ref('sequin_events') }} as sequin_events
                where {{ other_source_events_filter }}
            )
            select new_events.source, new_events.table_schema, new_events.table_name
            from new_events
            where new_events.action != 'truncate'
            union
            select
                new_events.source,
                substring_index(truncated.truncated_table, '.', 1) as table_schema,
                substring(
                    truncated.truncated_table,
                    length(substring_index(truncated.truncated_table, '.', 1)) + 2
                ) as table_name
            from new_events
                lateral view explode(new_events.truncated_tables) truncated as truncated_table
            where new_events.action = 'truncate'
            union
            select snapshot_pages.source, snapshot_pages.table_schema, snapshot_pages.table_name
            from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
            where {{ new_pages_filter }} and snapshot_pages.record_pk is not null
        {%- endset -%}
        {%- set touched_partitions = query_rows_at_execution(touched_partitions_query) -%}
        {%- set page_bounds_query -%}
            select snapshot_pages.source, max(snapshot_pages.high_watermark_lsn) as high
            from {{ source('bronze', 'snapshot_pages') }} as snapshot_pages
            where {{ new_pages_filter }} and snapshot_pages.record_pk is not null
            group by snapshot_pages.source
        {%- endset -%}
        {%- set page_event_ranges = query_rows_at_execution(page_bounds_query) -%}
    {%- endif -%}
{% endif %}

with

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

snapshot_pages as (

    select * from {{ source('bronze', 'snapshot_pages') }}

),

{% if is_incremental() %}
    current_records as (

        -- Only the partitions this run touches are read (the stored rows of other tables cannot
        -- change).
        select * from {{ this }} as stored_records
        {% if stored_rows is not none %}
            where {{ partitions_predicate(
                'stored_records', ['source', 'table_schema', 'table_name'], touched_partitions
            ) }}
        {% endif %}

    ),

    stored_positions as (

        -- An event that changed no row (e.g. a truncate of an empty table) is simply folded again
        -- next run, which changes nothing. Pages above max_commit_lsn are placed (again:
        -- idempotently) now.
        {{ rows_as_relation(stored_rows, [
            ['source', 'string'],
            ['max_seq', 'bigint'],
            ['max_commit_lsn', 'bigint'],
        ], stored_positions_query) }}

    ),
{% endif %}

new_events as (

    select sequin_events.*
    from sequin_events
    {% if is_incremental() %}
        -- Above the stored max seq of a source with stored rows (none when they all come from
        -- snapshot pages: then every event), or every event of a source without stored rows.
        inner join stored_positions
            on sequin_events.source = stored_positions.source
        where
            sequin_events.seq > coalesce(stored_positions.max_seq, 0)
            {% if stored_rows is not none %}
                and {{ stored_source_events_filter }}
            {% endif %}
        union all
        select sequin_events.*
        from sequin_events
        left anti join stored_positions
            on sequin_events.source = stored_positions.source
        {% if stored_rows is not none %}
            where {{ other_source_events_filter }}
        {% endif %}
    {% endif %}

),

row_changes as (

    -- insert and update upsert their key; a delete tombstones it.
    select
        source,
        table_schema,
        table_name,
        record_pk,
        case when action = 'delete' then 'delete' else 'upsert' end as change_kind,
        commit_lsn,
        commit_index,
        seq,
        commit_timestamp,
        record,
        old_record,
        unchanged_toast
    from new_events
    where action in ('insert', 'update', 'delete')

),

primary_key_changes as (

    -- An update that changed the primary key also deletes the old key (DESIGN §6).
    select
        source,
        table_schema,
        table_name,
        old_record_pk as record_pk,
        'delete' as change_kind,
        commit_lsn,
        commit_index,
        seq,
        commit_timestamp,
        cast(null as string) as record,
        old_record,
        cast(array() as array<string>) as unchanged_toast
    from new_events
    where
        action = 'update'
        and old_record_pk is not null
        and old_record_pk != record_pk

),

truncates as (

    select
        new_events.source,
        new_events.commit_lsn,
        new_events.commit_index,
        new_events.seq,
        new_events.commit_timestamp,
        substring_index(truncated.truncated_table, '.', 1) as table_schema,
        substring(
            truncated.truncated_table, length(substring_index(truncated.truncated_table, '.', 1)) + 2
        ) as table_name
    from new_events
        lateral view explode(new_events.truncated_tables) truncated as truncated_table
    where new_events.action = 'truncate'

),

-- ST03 is excluded here: only an incremental run (which has stored keys) reads this CTE.
truncated_tables as (  -- noqa: ST03

    select distinct
        source,
        table_schema,
        table_name
    from truncates

),

new_page_rows as (

    -- Page rows become usable once the source's safe bound has passed their page's watermark
    -- (DESIGN §5): by then every stream event that could supersede them is in sequin_events.
    select snapshot_pages.*
    from snapshot_pages
    inner join safe_bounds
        on snapshot_pages.source = safe_bounds.source
    {% if is_incremental() %}
        left join stored_positions
            on snapshot_pages.source = stored_positions.source
    {% endif %}
    where
        snapshot_pages.record_pk is not null
        and snapshot_pages.high_watermark_lsn <= safe_bounds.safe_lsn
    {% if is_incremental() %}
        and (
            stored_positions.source is null
            or snapshot_pages.high_watermark_lsn > stored_positions.max_commit_lsn
        )
        {% if stored_rows is not none %}
            and {{ new_pages_filter }}
        {% endif %}
    {% endif %}

),

page_key_events as (

    -- Row events touch their key; a primary-key change touches its old key too.
    select
        source,
        table_schema,
        table_name,
        record_pk,
        commit_lsn,
        transaction_id
    from sequin_events
    where
        action in ('insert', 'update', 'delete')
        {% if is_incremental() and stored_rows is not none %}
            and {{ source_ranges_predicate('sequin_events', 'commit_lsn', page_event_ranges) }}
        {% endif %}
    union all
    select
        source,
        table_schema,
        table_name,
        old_record_pk as record_pk,
        commit_lsn,
        transaction_id
    from sequin_events
    where
        action = 'update' and old_record_pk is not null and old_record_pk != record_pk
        {% if is_incremental() and stored_rows is not none %}
            and {{ source_ranges_predicate('sequin_events', 'commit_lsn', page_event_ranges) }}
        {% endif %}

),

page_table_truncates as (

    select
        sequin_events.source,
        sequin_events.commit_lsn,
        sequin_events.transaction_id,
        truncated.truncated_table
    from sequin_events
        lateral view explode(sequin_events.truncated_tables) truncated as truncated_table
    where
        sequin_events.action = 'truncate'
        {% if is_incremental() and stored_rows is not none %}
            and {{ source_ranges_predicate('sequin_events', 'commit_lsn', page_event_ranges) }}
        {% endif %}

),

superseded_page_rows as (

    -- A page row is superseded by an event for its key (a truncate counts for every key of its
    -- table) that commits at or before the page's watermark and that the page's MVCC snapshot
    -- could not see. Events the snapshot saw are older than the page row; events after the
    -- watermark are newer, which position order settles. MongoDB pages have no xids: every event
    -- at or before their cluster time is older.
    select distinct
        new_page_rows.snapshot_id,
        new_page_rows.page_number,
        new_page_rows.row_index
    from new_page_rows
    inner join page_key_events
        on
            new_page_rows.source = page_key_events.source
            and new_page_rows.table_schema = page_key_events.table_schema
            and new_page_rows.table_name = page_key_events.table_name
            and new_page_rows.record_pk = page_key_events.record_pk
    where
        page_key_events.commit_lsn <= new_page_rows.high_watermark_lsn
        and new_page_rows.snapshot_xmax is not null
        and not {{ pg_xid_visible(
            'page_key_events.transaction_id',
            'new_page_rows.snapshot_xmin',
            'new_page_rows.snapshot_xmax',
            'new_page_rows.snapshot_xip'
        ) }}
    union
    select
        new_page_rows.snapshot_id,
        new_page_rows.page_number,
        new_page_rows.row_index
    from new_page_rows
    inner join page_table_truncates
        on
            new_page_rows.source = page_table_truncates.source
            and concat(new_page_rows.table_schema, '.', new_page_rows.table_name)
            = page_table_truncates.truncated_table
    where
        page_table_truncates.commit_lsn <= new_page_rows.high_watermark_lsn
        and new_page_rows.snapshot_xmax is not null
        and not {{ pg_xid_visible(
            'page_table_truncates.transaction_id',
            'new_page_rows.snapshot_xmin',
            'new_page_rows.snapshot_xmax',
            'new_page_rows.snapshot_xip'
        ) }}

),

page_changes as (

    -- Surviving page rows take the position (high watermark, row index in page); a MongoDB page
    -- row sits after every event at its cluster time.
    select
        new_page_rows.source,
        new_page_rows.table_schema,
        new_page_rows.table_name,
        new_page_rows.record_pk,
        'snapshot' as change_kind,
        new_page_rows.high_watermark_lsn as commit_lsn,
        case
            when new_page_rows.snapshot_xmax is null then 2147483647 else new_page_rows.row_index
        end as commit_index,
        cast(null as bigint) as seq,
        new_page_rows.read_at as commit_timestamp,
        new_page_rows.record,
        cast(null as string) as old_record,
        cast(array() as array<string>) as unchanged_toast
    from new_page_rows
    left anti join superseded_page_rows
        on
            new_page_rows.snapshot_id = superseded_page_rows.snapshot_id
            and new_page_rows.page_number = superseded_page_rows.page_number
            and new_page_rows.row_index = superseded_page_rows.row_index

),

keyed_changes as (

    select * from row_changes
    union all
    select * from primary_key_changes
    union all
    select * from page_changes

),

truncated_keys as (

    -- A truncate is an event for every key of its table: the keys changed in this batch and
    -- (incrementally) the keys already stored.
    select distinct
        source,
        table_schema,
        table_name,
        record_pk
    from keyed_changes
    {% if is_incremental() %}
        union
        select
            current_records.source,
            current_records.table_schema,
            current_records.table_name,
            current_records.record_pk
        from current_records
        inner join truncated_tables
            on
                current_records.source = truncated_tables.source
                and current_records.table_schema = truncated_tables.table_schema
                and current_records.table_name = truncated_tables.table_name
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
        cast(array() as array<string>) as unchanged_toast
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

),

key_histories as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        array_sort(collect_list(struct(
            commit_lsn,
            commit_index,
            seq,
            commit_timestamp,
            change_kind,
            record,
            old_record,
            unchanged_toast
        ))) as changes
    from all_changes
    group by source, table_schema, table_name, record_pk

),

starting_states as (

    select
        key_histories.*,
        {% if is_incremental() %}
            current_records.record_pk is not null as has_current,
            current_records.record as current_record,
            current_records.deleted as current_deleted,
            current_records.deleted_at as current_deleted_at,
            current_records.needs_reread as current_needs_reread,
            current_records.commit_lsn as current_commit_lsn,
            current_records.commit_index as current_commit_index,
            current_records.seq as current_seq,
            current_records.origin as current_origin,
            current_records.updated_at as current_updated_at
        {% else %}
            false as has_current,
            cast(null as string) as current_record,
            cast(null as boolean) as current_deleted,
            cast(null as timestamp) as current_deleted_at,
            cast(null as boolean) as current_needs_reread,
            cast(null as bigint) as current_commit_lsn,
            cast(null as int) as current_commit_index,
            cast(null as bigint) as current_seq,
            cast(null as string) as current_origin,
            cast(null as timestamp) as current_updated_at
        {% endif %}
    from key_histories
    {% if is_incremental() %}
        left join current_records
            on
                key_histories.source = current_records.source
                and key_histories.table_schema = current_records.table_schema
                and key_histories.table_name = current_records.table_name
                and key_histories.record_pk = current_records.record_pk
    {% endif %}

),

folded as (

    select
        source,
        table_schema,
        table_name,
        record_pk,
        has_current,
        current_commit_lsn,
        current_commit_index,
        {{ fold_record_changes(
            'changes',
            "named_struct(
                'is_present', has_current,
                'record', current_record,
                'deleted', current_deleted,
                'deleted_at', current_deleted_at,
                'needs_reread', current_needs_reread,
                'commit_lsn', current_commit_lsn,
                'commit_index', current_commit_index,
                'seq', current_seq,
                'origin', current_origin,
                'updated_at', current_updated_at
            )"
        ) }} as record_state
    from starting_states

),

final as (

    select
        folded.source,
        folded.table_schema,
        folded.table_name,
        folded.record_pk,
        folded.record_state.record,
        folded.record_state.deleted,
        folded.record_state.deleted_at,
        folded.record_state.needs_reread,
        folded.record_state.commit_lsn,
        folded.record_state.commit_index,
        folded.record_state.seq,
        folded.record_state.origin,
        folded.record_state.updated_at
    from folded
    where
        folded.record_state.is_present
        and (
            not folded.has_current
            or folded.record_state.commit_lsn > folded.current_commit_lsn
            or (
                folded.record_state.commit_lsn = folded.current_commit_lsn
                and folded.record_state.commit_index > folded.current_commit_index
            )
        )

)

select * from final
