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
-- A whole-table snapshot whose last watermark the safe bound passes also places the keys it did
-- not find (docs/snapshots.md, "Re-snapshots find deletes"): one absent row per such key, a
-- tombstone at the snapshot's last watermark, and one completion row for the snapshot.
-- A run with no page to place runs no statement (snapshot_rows_placed_scan_bounds).

{%- set bounds = snapshot_rows_placed_scan_bounds() %}
{#- Looked for only when a whole-table snapshot may have completed (none: a full build, a unit test). -#}
{%- set finds_absent = bounds.completed_tables is none or bounds.completed_tables | length > 0 %}
{%- set table_identity = ['source', 'table_schema', 'table_name'] %}
{%- set safe_bound_columns = [['source', 'string'], ['safe_lsn', 'bigint']] %}
{%- set stored_safe_bounds = 'select source, safe_lsn from ' ~ ref('safe_bounds') %}

with

snapshot_pages as (

    select * from {{ source('bronze', 'snapshot_pages') }}

),

sequin_events as (

    select * from {{ ref('sequin_events') }}

),

safe_bounds as (

    -- The run's bounds, read once as literals (bounds.safe_bound_rows): Spark plans this CTE at
    -- each of its references, and a literal relation costs no scan.
    {{ rows_as_relation(bounds.safe_bound_rows, safe_bound_columns, stored_safe_bounds) }}

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

placed_page_rows as (

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

),

{% if finds_absent %}
    whole_table_part_ends as (

        -- The last page of each part of a whole-table snapshot (bronze table_snapshot: a snapshot of
        -- the whole table, cut into `parts` key ranges, each a snapshot of its own; re-reads by key
        -- and filtered snapshots have none).
        select distinct
            part_ends.source,
            part_ends.table_schema,
            part_ends.table_name,
            part_ends.table_snapshot.id as table_snapshot_id,
            part_ends.table_snapshot.parts as table_snapshot_parts,
            part_ends.table_snapshot.xmin as snapshot_xmin,
            part_ends.table_snapshot.xmax as snapshot_xmax,
            part_ends.table_snapshot.xip as snapshot_xip,
            part_ends.snapshot_id,
            part_ends.high_watermark_lsn,
            part_ends.read_at
        from snapshot_pages as part_ends
        where
            part_ends.last_page
            and part_ends.table_snapshot is not null
        {% if bounds.completed_tables is not none %}
                and {{ partitions_predicate('part_ends', table_identity, bounds.completed_tables) }}
            {% endif %}

    ),

    newly_completed_snapshots as (

        -- Whole-table snapshots whose every part completed, the first time the safe bound passes
        -- their last watermark: every event at or below it is in sequin_events.
        select
            part_ends.source,
            part_ends.table_schema,
            part_ends.table_name,
            part_ends.table_snapshot_id,
            part_ends.snapshot_xmin,
            part_ends.snapshot_xmax,
            part_ends.snapshot_xip,
            max(part_ends.high_watermark_lsn) as completed_lsn,
            max(part_ends.read_at) as completed_at
        from whole_table_part_ends as part_ends
        inner join safe_bounds
            on part_ends.source = safe_bounds.source
        {% if is_incremental() %}
            left join placed_positions
                on part_ends.source = placed_positions.source
        {% endif %}
        group by
            part_ends.source,
            part_ends.table_schema,
            part_ends.table_name,
            part_ends.table_snapshot_id,
            part_ends.snapshot_xmin,
            part_ends.snapshot_xmax,
            part_ends.snapshot_xip
        having
            count(distinct part_ends.snapshot_id) = max(part_ends.table_snapshot_parts)
            and max(part_ends.high_watermark_lsn) <= max(safe_bounds.safe_lsn)
        {% if is_incremental() %}
            and (
                max(placed_positions.max_commit_lsn) is null
                or max(part_ends.high_watermark_lsn) > max(placed_positions.max_commit_lsn)
            )
        {% endif %}

    ),

    completed_snapshot_pages as (

        -- Every page row of those snapshots (superseded or not: a superseded row's key was there).
        select
            completed.source,
            completed.table_snapshot.id as table_snapshot_id,
            completed.record_pk
        from snapshot_pages as completed
        inner join newly_completed_snapshots
            on
                completed.source = newly_completed_snapshots.source
                and completed.table_schema = newly_completed_snapshots.table_schema
                and completed.table_name = newly_completed_snapshots.table_name
                and completed.table_snapshot.id = newly_completed_snapshots.table_snapshot_id

    ),

    -- The stream's events of those tables, by the key they touch.
    table_key_events as (

        {{ event_keys(
            'sequin_events',
            [
                'source', 'table_schema', 'table_name', 'action', 'commit_lsn', 'commit_index',
                'transaction_id',
            ],
            none if bounds.completed_tables is none
            else partitions_predicate('sequin_events', table_identity, bounds.completed_tables),
        ) }}

    ),

    key_changes as (

        -- What silver knows of each key of those tables, by position: the stream's events (with
        -- their transaction) and the page rows placed (this run's and earlier ones). Absent rows
        -- placed before are left out, as a full build could not see them: a key they tombstoned
        -- gets another, which changes nothing, and the rows do not depend on when the run happens.
        select
            source,
            table_schema,
            table_name,
            record_pk,
            commit_lsn,
            commit_index,
            transaction_id,
            action = 'delete' or is_old_key as removes
        from table_key_events
        union all
        select
            source,
            table_schema,
            table_name,
            record_pk,
            commit_lsn,
            commit_index,
            cast(null as bigint) as transaction_id,
            false as removes
        from placed_page_rows
        where not is_superseded
        {% if is_incremental() %}
            union all
            select
                placed.source,
                placed.table_schema,
                placed.table_name,
                placed.record_pk,
                placed.commit_lsn,
                placed.commit_index,
                cast(null as bigint) as transaction_id,
                false as removes
            from {{ this }} as placed
            where
                not placed.is_superseded
                and placed.record is not null
                {% if bounds.completed_tables is not none %}
                    and {{ partitions_predicate('placed', table_identity, bounds.completed_tables) }}
                {% endif %}
        {% endif %}

    ),

    truncated_tables as (

        -- The stream's truncates, one row per table each truncated.
        select
            truncating.source,
            truncating.commit_lsn,
            truncating.commit_index,
            truncated.truncated_table
        from sequin_events as truncating
            lateral view explode(truncating.truncated_tables) truncated as truncated_table
        where truncating.action = 'truncate'

    ),

    last_truncates as (

        -- The last truncate of the table at or below each completion: it ended every key before it.
        select
            newly_completed_snapshots.source,
            newly_completed_snapshots.table_snapshot_id,
            max(named_struct(
                'commit_lsn', truncated_tables.commit_lsn, 'commit_index', truncated_tables.commit_index
            )) as truncated_at
        from truncated_tables
        inner join newly_completed_snapshots
            on
                truncated_tables.source = newly_completed_snapshots.source
                and truncated_tables.truncated_table
                = concat(newly_completed_snapshots.table_schema, '.', newly_completed_snapshots.table_name)
        where truncated_tables.commit_lsn <= newly_completed_snapshots.completed_lsn
        group by newly_completed_snapshots.source, newly_completed_snapshots.table_snapshot_id

    ),

    live_keys as (

        -- Per completed snapshot, the keys of its table that the last change silver knows of at or
        -- below the completion leaves live (not a delete, and after the table's last truncate):
        -- only what the run could see then, so any later run finds the same. changed_while_read:
        -- an event the bound's MVCC snapshot could not see touched the key at or before the
        -- completion, so it may have been written after the page of its range was read (an
        -- event after the completion orders after the tombstone anyway). Computed here, in the
        -- one pass over the key's changes, so that no part of this search is planned twice.
        select
            newly_completed_snapshots.source,
            newly_completed_snapshots.table_schema,
            newly_completed_snapshots.table_name,
            newly_completed_snapshots.table_snapshot_id,
            newly_completed_snapshots.completed_lsn,
            newly_completed_snapshots.completed_at,
            key_changes.record_pk,
            bool_or(coalesce(
                key_changes.transaction_id is not null
                and not {{ pg_xid_visible(
                    'key_changes.transaction_id',
                    'newly_completed_snapshots.snapshot_xmin',
                    'newly_completed_snapshots.snapshot_xmax',
                    'newly_completed_snapshots.snapshot_xip'
                ) }},
                false
            )) as changed_while_read
        from key_changes
        inner join newly_completed_snapshots
            on
                key_changes.source = newly_completed_snapshots.source
                and key_changes.table_schema = newly_completed_snapshots.table_schema
                and key_changes.table_name = newly_completed_snapshots.table_name
        left join last_truncates
            on
                newly_completed_snapshots.source = last_truncates.source
                and newly_completed_snapshots.table_snapshot_id = last_truncates.table_snapshot_id
        where key_changes.commit_lsn <= newly_completed_snapshots.completed_lsn
        group by
            newly_completed_snapshots.source,
            newly_completed_snapshots.table_schema,
            newly_completed_snapshots.table_name,
            newly_completed_snapshots.table_snapshot_id,
            newly_completed_snapshots.completed_lsn,
            newly_completed_snapshots.completed_at,
            key_changes.record_pk
        having
            not max_by(
                key_changes.removes,
                named_struct('commit_lsn', key_changes.commit_lsn, 'commit_index', key_changes.commit_index)
            )
            and (
                max(last_truncates.truncated_at) is null
                or max(named_struct('commit_lsn', key_changes.commit_lsn, 'commit_index', key_changes.commit_index))
                > max(last_truncates.truncated_at)
            )

    ),

    absent_keys as (

        -- Live keys of the table that no page of the completed snapshot holds, but those an event
        -- changed while the snapshot read (left alone).
        select live_keys.*
        from live_keys
        left anti join completed_snapshot_pages
            on
                live_keys.source = completed_snapshot_pages.source
                and live_keys.table_snapshot_id = completed_snapshot_pages.table_snapshot_id
                and live_keys.record_pk = completed_snapshot_pages.record_pk
        where not live_keys.changed_while_read

    ),

    absent_rows as (

        -- A tombstone at the completion's position, after every page row and event at it.
        select
            absent_keys.source,
            absent_keys.table_snapshot_id as snapshot_id,
            cast(-1 as bigint) as page_number,
            cast(
                row_number() over (
                    partition by absent_keys.source, absent_keys.table_snapshot_id
                    order by absent_keys.record_pk
                ) - 1 as int
            ) as row_index,
            absent_keys.table_schema,
            absent_keys.table_name,
            absent_keys.record_pk,
            cast(null as string) as record,
            false as is_superseded,
            absent_keys.completed_lsn as commit_lsn,
            2147483647 as commit_index,
            absent_keys.completed_at as read_at
        from absent_keys

    ),

    completion_rows as (

        -- One row per completed snapshot: it moves the placed position past the completion even
        -- when its last page held no row, so the next run does not look again. Never folded.
        select
            source,
            table_snapshot_id as snapshot_id,
            cast(-1 as bigint) as page_number,
            -1 as row_index,
            table_schema,
            table_name,
            cast(null as string) as record_pk,
            cast(null as string) as record,
            true as is_superseded,
            completed_lsn as commit_lsn,
            2147483647 as commit_index,
            completed_at as read_at
        from newly_completed_snapshots

    ),
{% endif %}

final as (

    select * from placed_page_rows
    {% if finds_absent %}
        union all
        select * from absent_rows
        union all
        select * from completion_rows
    {% endif %}

)

select * from final
