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
          macros/skip/materialization_changelake_*.sql).
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
