{% macro changelake_run_state(compute=true) %}
    {#-
        What this dbt invocation found in bronze, decided once per invocation by one small read of
        the positions: a dict with
        - current_rows: per source the bound bronze.stream_positions gives now (source, safe_lsn,
          max_observed_lsn, writer_count, positions_updated_us = unix micros of the last position
          update); silver.safe_bounds is built from these rows, so the run and its decision agree;
        - loaded_rows: per source the safe bound silver's last complete run loaded through
          (silver.loaded_bounds), [] before the first one;
        - positions_unchanged: bronze.stream_positions gives exactly what silver.safe_bounds holds
          (same sources, bounds, writers and last update): safe_bounds, table_columns and
          snapshot_progress would be rewritten with what they hold;
        - bounds_loaded: every source's safe bound is the one silver loaded through (same
          sources): loaded_bounds would be rewritten with what it holds;
        - nothing_new: bounds_loaded, or the bounds moved past the loaded ones over no change event
          and no snapshot page row (a `run --once` drain marker, heartbeats: logical messages
          silver leaves out), which a second small read finds out (Delta skips every bronze file
          outside the new position ranges): the incremental silver models would add nothing, so
          they start no Spark job (materializations `incremental` and `table` in
          macros/skip_when_unchanged.sql).
        Returns none at parse time, in a dbt unit test, without a registered bronze.stream_positions
        (sqlfluff's templater), and with compute=false when no node of this invocation computed it
        yet (data tests then check whole tables).
        The decision is kept in the `graph` dict, which every node of an invocation shares, keyed
        by invocation_id; each node would otherwise read the positions again.
    -#}
    {%- if not execute or model.resource_type == 'unit_test' -%}
        {{ return(none) }}
    {%- endif -%}
    {%- set cached = graph.get('changelake_run_state') -%}
    {%- if cached and cached.invocation_id == invocation_id -%}
        {{ return(cached.state) }}
    {%- endif -%}
    {%- if not compute -%}
        {{ return(none) }}
    {%- endif -%}

    {%- set positions = graph.sources['source.changelake.bronze.stream_positions'] -%}
    {%- if adapter.get_relation(database=positions.database, schema=positions.schema,
        identifier=positions.identifier) is none -%}
        {#- No registered bronze (sqlfluff's templater on a scratch warehouse): nothing to decide. -#}
        {{ return(none) }}
    {%- endif -%}
    {%- set safe_bounds_node = graph.nodes['model.changelake.safe_bounds'] -%}
    {%- set loaded_bounds_node = graph.nodes['model.changelake.loaded_bounds'] -%}
    {%- set safe_bounds_relation = adapter.get_relation(
        database=safe_bounds_node.database, schema=safe_bounds_node.schema,
        identifier=safe_bounds_node.alias) -%}
    {%- set loaded_bounds_relation = adapter.get_relation(
        database=loaded_bounds_node.database, schema=loaded_bounds_node.schema,
        identifier=loaded_bounds_node.alias) -%}
    {%- set query -%}
        select
            'current' as kind,
            source,
            safe_lsn,
            max_observed_lsn,
            writer_count,
            unix_micros(positions_updated_at) as positions_updated_us
        from ({{ safe_bounds_from_positions(positions.relation_name) }}) as current_bounds
        {%- if safe_bounds_relation is not none %}
            union all
            select
                'stored' as kind,
                source,
                safe_lsn,
                max_observed_lsn,
                writer_count,
                unix_micros(positions_updated_at) as positions_updated_us
            from {{ safe_bounds_relation }}
        {%- endif %}
        {%- if loaded_bounds_relation is not none %}
            union all
            select
                'loaded' as kind,
                source,
                loaded_safe_lsn as safe_lsn,
                cast(null as bigint) as max_observed_lsn,
                cast(null as bigint) as writer_count,
                cast(null as bigint) as positions_updated_us
            from {{ loaded_bounds_relation }}
        {%- endif %}
    {%- endset -%}
    {%- set rows = query_rows_at_execution(query) -%}
    {%- set current_rows = rows | selectattr('kind', 'equalto', 'current') | list -%}
    {%- set stored_rows = rows | selectattr('kind', 'equalto', 'stored') | list -%}
    {%- set loaded_rows = rows | selectattr('kind', 'equalto', 'loaded') | list -%}
    {%- set bounds_loaded = loaded_bounds_relation is not none
        and changelake_same_rows(current_rows, loaded_rows, ['safe_lsn']) -%}
    {%- set state = {
        'current_rows': current_rows,
        'loaded_rows': loaded_rows,
        'positions_unchanged': changelake_same_rows(
            current_rows, stored_rows,
            ['safe_lsn', 'max_observed_lsn', 'writer_count', 'positions_updated_us']),
        'bounds_loaded': bounds_loaded,
        'nothing_new': bounds_loaded or (loaded_bounds_relation is not none
            and changelake_nothing_between(current_rows, loaded_rows)),
    } -%}
    {%- do log('changelake: positions ' ~ ('unchanged' if state.positions_unchanged else 'changed')
        ~ ', ' ~ ('nothing new past the loaded safe bound' if state.nothing_new else 'new data to load')
        ~ ('' if state.bounds_loaded or not state.nothing_new else ' (the bound moved over logical messages only)'),
        info=true) -%}
    {%- do graph.update({'changelake_run_state': {'invocation_id': invocation_id, 'state': state}}) -%}
    {{ return(state) }}
{% endmacro %}


{% macro changelake_nothing_between(current_rows, loaded_rows) %}
    {#-
        Whether bronze holds no change event and no snapshot page row between each source's loaded
        bound (exclusive) and its current bound (inclusive); false when a source is new or a bound
        went back. One query; the position ranges are literals, so Delta reads only the files whose
        commit_lsn / high_watermark_lsn statistics overlap them.
    -#}
    {%- if current_rows | length != loaded_rows | length or not current_rows -%}
        {{ return(false) }}
    {%- endif -%}
    {%- set ranges = [] -%}
    {%- for current in current_rows -%}
        {%- set loaded = loaded_rows | selectattr('source', 'equalto', current.source) | list -%}
        {%- if loaded | length != 1 or loaded[0].get('safe_lsn') is none or current.get('safe_lsn') is none
            or current.safe_lsn < loaded[0].safe_lsn -%}
            {{ return(false) }}
        {%- endif -%}
        {%- if current.safe_lsn > loaded[0].safe_lsn -%}
            {%- do ranges.append({'source': current.source, 'low': loaded[0].safe_lsn + 1, 'high': current.safe_lsn}) -%}
        {%- endif -%}
    {%- endfor -%}
    {%- set wal_events = graph.sources['source.changelake.bronze.wal_events'].relation_name -%}
    {%- set snapshot_pages = graph.sources['source.changelake.bronze.snapshot_pages'].relation_name -%}
    {%- set query -%}
        select wal_events.source
        from {{ wal_events }} as wal_events
        where
            {{ source_ranges_predicate('wal_events', 'commit_lsn', ranges) }}
            and wal_events.action in ('insert', 'update', 'delete', 'truncate')
        union all
        select snapshot_pages.source
        from {{ snapshot_pages }} as snapshot_pages
        where
            {{ source_ranges_predicate('snapshot_pages', 'high_watermark_lsn', ranges) }}
            and snapshot_pages.record_pk is not null
        limit 1
    {%- endset -%}
    {{ return(query_rows_at_execution(query) | length == 0) }}
{% endmacro %}


{% macro changelake_same_rows(left_rows, right_rows, columns) %}
    {#- Whether two lists of per-source rows name the same sources with equal `columns`. -#}
    {%- if left_rows | length != right_rows | length or not left_rows -%}
        {{ return(false) }}
    {%- endif -%}
    {%- for left in left_rows -%}
        {%- set right = right_rows | selectattr('source', 'equalto', left.source) | list -%}
        {%- if right | length != 1 -%}
            {{ return(false) }}
        {%- endif -%}
        {%- for column in columns -%}
            {%- if left.get(column) != right[0].get(column) -%}
                {{ return(false) }}
            {%- endif -%}
        {%- endfor -%}
    {%- endfor -%}
    {{ return(true) }}
{% endmacro %}


{% macro changelake_nothing_new() %}
    {#- True when this run finds nothing past the safe bound silver loaded (changelake_run_state). -#}
    {%- set state = changelake_run_state() -%}
    {{ return(state is not none and state.nothing_new) }}
{% endmacro %}


{% macro safe_bounds_rows(rows) %}
    {#- The SELECT of silver.safe_bounds for changelake_run_state's current_rows, as literals. -#}
    {%- set selects = [] -%}
    {%- for row in rows -%}
        {%- do selects.append('select ' ~ sql_literal(row.source, 'string') ~ ' as source, '
            ~ sql_literal(row.get('safe_lsn'), 'bigint') ~ ' as safe_lsn, '
            ~ sql_literal(row.get('max_observed_lsn'), 'bigint') ~ ' as max_observed_lsn, '
            ~ sql_literal(row.get('writer_count'), 'bigint') ~ ' as writer_count, '
            ~ 'timestamp_micros(' ~ sql_literal(row.get('positions_updated_us'), 'bigint')
            ~ ') as positions_updated_at') -%}
    {%- endfor -%}
    {%- if not selects -%}
        {%- do selects.append('select cast(null as string) as source, cast(null as bigint) as safe_lsn, '
            ~ 'cast(null as bigint) as max_observed_lsn, cast(null as bigint) as writer_count, '
            ~ 'cast(null as timestamp) as positions_updated_at where false') -%}
    {%- endif -%}
    {{ return(selects | join('\n        union all\n        ')) }}
{% endmacro %}


{% macro safe_bounds_from_positions(stream_positions) %}
    {#-
        The SELECT of silver.safe_bounds from the positions relation `stream_positions`: per source
        min(durable_lsn) over its writers (safe_lsn), the highest durable or acknowledged position
        (max_observed_lsn), the writer count and the last position update. durable_lsn is never
        lowered, so a writer's highest row is its current one (this also holds if positions are ever
        appended rather than upserted).
    -#}
    select
        source,
        min(durable_lsn) as safe_lsn,
        max(observed_lsn) as max_observed_lsn,
        count(*) as writer_count,
        max(updated_at) as positions_updated_at
    from (
        select
            source,
            writer_id,
            max(durable_lsn) as durable_lsn,
            max(greatest(durable_lsn, coalesce(ack_lsn, durable_lsn))) as observed_lsn,
            max(updated_at) as updated_at
        from {{ stream_positions }}
        group by source, writer_id
    ) as writer_positions
    group by source
{% endmacro %}
