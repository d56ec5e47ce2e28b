{% macro records_changed_since(relation) %}
    {#-
        A parenthesised SELECT of the silver.consumer_records rows whose state changed after what a
        user's incremental model over them stored: per source, position (commit_lsn, commit_index)
        above the highest one in `relation` (usually `this`). consumer_records holds one state per
        key at the position of the change that made it, and a run of silver writes every state up
        to its safe bound at once, so no state at or below the stored position can appear later:
        merging these rows on (source, table_schema, table_name, record_pk) keeps the model equal to
        consumer_records. Deleted and truncated keys come as tombstones (deleted = true).
        `relation` must keep `source`, `commit_lsn` and `commit_index`.
        Called from a host project's model, an unqualified macro name resolves in the host's
        namespace, not this package's: the macros it calls are named with `changelake.`.
    -#}
    {%- set stored_query -%}
        select
            source,
            max(struct(commit_lsn, commit_index)).commit_lsn as stored_commit_lsn,
            max(struct(commit_lsn, commit_index)).commit_index as stored_commit_index
        from {{ relation }}
        group by source
    {%- endset -%}
    {%- set stored = changelake.changelake_stored_positions(relation, stored_query) -%}
    (
        select records.*
        from {{ ref('consumer_records') }} as records
        {%- if stored is not none %}
            left join (
                {{ changelake.rows_as_relation(stored.rows, [
                    ['source', 'string'],
                    ['stored_commit_lsn', 'bigint'],
                    ['stored_commit_index', 'int'],
                ], stored_query) }}
            ) as stored
                on records.source = stored.source
            where
                stored.source is null
                or records.commit_lsn > stored.stored_commit_lsn
                or (
                    records.commit_lsn = stored.stored_commit_lsn
                    and records.commit_index > stored.stored_commit_index
                )
        {%- endif %}
    )
{% endmacro %}
