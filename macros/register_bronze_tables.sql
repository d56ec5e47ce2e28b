{% macro register_bronze_tables() %}
    {#-
        on-run-start: make bronze.<table> point at the Delta tables ingest writes by path under
        var('changelake_bronze_root'). Ingest never touches the metastore.
        - A path that holds a Delta table is registered as it is (schema from its log).
        - A missing one is an error: bronze is created and written only by ingest (delta-rs; no
          Spark job writes bronze, docs/cluster.md), so dbt says to run ingest first.
        Existence is probed with one glob over the bronze root's _delta_log directories; the probe
        also lists the bronze schema's own (always present, empty) directory so the glob never
        matches nothing.
    -#}
    {%- if not execute -%}{{ return('') }}{%- endif -%}
    {%- set bronze_root = var('changelake_bronze_root').rstrip('/') -%}
    {%- set known_tables = [
        'wal_events', 'stream_positions', 'source_relations', 'snapshot_pages', 'verification_runs'
    ] -%}

    {%- do run_query('create schema if not exists bronze') -%}
    {%- set schema_location = run_query('describe schema bronze').rows
        | selectattr(0, 'equalto', 'Location') | map(attribute=1) | first -%}
    {%- if schema_location.startswith('file:') -%}
        {%- set schema_location = '/' ~ schema_location[5:].lstrip('/') -%}
    {%- endif -%}
    {#- Hadoop globs take {a,b} alternatives only after a common directory prefix. -#}
    {%- set probe_parts = schema_location.split('/') -%}
    {%- set root_parts = bronze_root.split('/') -%}
    {%- set shared = namespace(n=0, open=true) -%}
    {%- for part in probe_parts[:-1] -%}
        {%- if shared.open and loop.index0 < root_parts | length - 1
            and root_parts[loop.index0] == part -%}
            {%- set shared.n = loop.index -%}
        {%- else -%}
            {%- set shared.open = false -%}
        {%- endif -%}
    {%- endfor -%}
    {%- if shared.n == 0 -%}
        {%- do exceptions.raise_compiler_error(
            'bronze schema location ' ~ schema_location ~ ' and bronze root ' ~ bronze_root
            ~ ' share no parent directory; put spark.sql.warehouse.dir on the same file system') -%}
    {%- endif -%}
    {%- set probe -%}
        select distinct regexp_extract(path, '/([^/]+)/_delta_log/[^/]+$', 1) as table_name
        from binaryFile.`{{ probe_parts[:shared.n] | join('/') }}/{{ '{' -}}
            {{ probe_parts[shared.n:] | join('/') }},{{ root_parts[shared.n:] | join('/') }}/*/_delta_log
        {{- '}' }}`
    {%- endset -%}
    {%- set existing = run_query(probe).columns[0].values() | list -%}

    {%- for table_name in known_tables -%}
        {%- set location = bronze_root ~ '/' ~ table_name -%}
        {%- if table_name in existing -%}
            {%- do run_query(
                'create table if not exists bronze.' ~ table_name ~ " using delta location '" ~ location ~ "'") -%}
        {%- else -%}
            {%- do exceptions.raise_compiler_error(
                'bronze.' ~ table_name ~ ' not found at ' ~ location
                ~ ': bronze is created by ingest; run `changelake-ingest run --once` first') -%}
        {%- endif -%}
    {%- endfor -%}
{% endmacro %}
