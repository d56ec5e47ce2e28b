{{
    config(
        incremental_strategy='append',
        skip_when='nothing_new',
        partition_by=['source'],
    )
}}

-- One row per usable snapshot page row (DESIGN §5): a bronze.snapshot_pages row whose page's high
-- watermark the source's safe bound has passed, with where §5 places it: superseded (dropped), or at
-- position (high watermark, row index). A placement is final once usable: every stream event that
-- can supersede a row commits at or before its watermark, so it is in sequin_events by then
-- (DESIGN §4). Each run appends the rows of the pages that became usable since the last run.

{%- set bounds = snapshot_rows_placed_scan_bounds() %}

with

snapshot_pages as (

    select * from {{ source('bronze', 'snapshot_pages') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

safe_bounds as (

    select * from {{ ref('safe_bounds') }}

),

{% if is_incremental() %}
    placed_positions as (

        -- A page at or below a source's highest placed watermark was usable, so placed, in an
        -- earlier run: a page is in bronze before the safe bound passes its watermark (its writer
        -- raises its position only after the page's commit, docs/snapshots.md).
        {{ rows_as_relation(bounds.placed_rows, [
            ['source', 'string'],
            ['max_commit_lsn', 'bigint'],
        ], bounds.placed_positions_query) }}

    ),
{% endif %}

usable_page_rows as (

    -- Page rows (not the marker row of an empty page) whose watermark the safe bound has passed.
    select snapshot_pages.*
    from snapshot_pages
    inner join safe_bounds
        on snapshot_pages.source = safe_bounds.source
    {% if is_incremental() %}
        left join placed_positions
            on snapshot_pages.source = placed_positions.source
    {% endif %}
    where
        snapshot_pages.record_pk is not null
        and snapshot_pages.high_watermark_lsn <= safe_bounds.safe_lsn
    {% if is_incremental() %}
        and (
            placed_positions.source is null
            or snapshot_pages.high_watermark_lsn > placed_positions.max_commit_lsn
        )
        {% if bounds.new_pages_filter is not none %}
            and {{ bounds.new_pages_filter }}
        {% endif %}
    {% endif %}

),

-- Row events touch their key; a primary-key change touches its old key too.
key_events as (

    {{ event_keys(
        'sequin_events',
        ['source', 'table_schema', 'table_name', 'commit_lsn', 'transaction_id'],
        bounds.page_events_filter,
    ) }}

),

table_truncates as (

    select
        sequin_events.source,
        sequin_events.commit_lsn,
        sequin_events.transaction_id,
        truncated.truncated_table
    from sequin_events
        lateral view explode(sequin_events.truncated_tables) truncated as truncated_table
    where
        sequin_events.action = 'truncate'
        and {{ bounds.page_events_filter or 'true' }}

),

superseded_page_rows as (

    -- A page row is superseded by an event for its key (a truncate counts for every key of its
    -- table) that commits at or before the page's watermark and that the page's MVCC snapshot
    -- could not see. Events the snapshot saw are older than the page row; events after the
    -- watermark are newer, which position order settles. MongoDB pages have no xids: every event
    -- at or before their cluster time is older.
    select distinct
        usable_page_rows.source,
        usable_page_rows.snapshot_id,
        usable_page_rows.page_number,
        usable_page_rows.row_index
    from usable_page_rows
    inner join key_events
        on
            usable_page_rows.source = key_events.source
            and usable_page_rows.table_schema = key_events.table_schema
            and usable_page_rows.table_name = key_events.table_name
            and usable_page_rows.record_pk = key_events.record_pk
    where
        key_events.commit_lsn <= usable_page_rows.high_watermark_lsn
        and usable_page_rows.snapshot_xmax is not null
        and not {{ pg_xid_visible(
            'key_events.transaction_id',
            'usable_page_rows.snapshot_xmin',
            'usable_page_rows.snapshot_xmax',
            'usable_page_rows.snapshot_xip'
        ) }}
    union
    -- Matched on the whole 'schema.table' text, exact whatever the names hold.
    select
        usable_page_rows.source,
        usable_page_rows.snapshot_id,
        usable_page_rows.page_number,
        usable_page_rows.row_index
    from usable_page_rows
    inner join table_truncates
        on
            usable_page_rows.source = table_truncates.source
            and concat(usable_page_rows.table_schema, '.', usable_page_rows.table_name)
            = table_truncates.truncated_table
    where
        table_truncates.commit_lsn <= usable_page_rows.high_watermark_lsn
        and usable_page_rows.snapshot_xmax is not null
        and not {{ pg_xid_visible(
            'table_truncates.transaction_id',
            'usable_page_rows.snapshot_xmin',
            'usable_page_rows.snapshot_xmax',
            'usable_page_rows.snapshot_xip'
        ) }}

),

final as (

    -- Surviving page rows take the position (high watermark, row index in page); a MongoDB page
    -- row sits after every event at its cluster time.
    select
        usable_page_rows.source,
        usable_page_rows.snapshot_id,
        usable_page_rows.page_number,
        usable_page_rows.row_index,
        usable_page_rows.table_schema,
        usable_page_rows.table_name,
        usable_page_rows.record_pk,
        usable_page_rows.record,
        superseded_page_rows.snapshot_id is not null as is_superseded,
        usable_page_rows.high_watermark_lsn as commit_lsn,
        case
            when usable_page_rows.snapshot_xmax is null then 2147483647 else usable_page_rows.row_index
        end as commit_index,
        usable_page_rows.read_at
    from usable_page_rows
    left join superseded_page_rows
        on
            usable_page_rows.source = superseded_page_rows.source
            and usable_page_rows.snapshot_id = superseded_page_rows.snapshot_id
            and usable_page_rows.page_number = superseded_page_rows.page_number
            and usable_page_rows.row_index = superseded_page_rows.row_index

)

select * from final
