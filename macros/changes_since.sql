{% macro changes_since(relation, seq_column='seq') %}
    {#-
        A parenthesised SELECT of the silver.sequin_events rows a user's incremental model over
        them has not stored yet: per source, seq above the highest `seq_column` in `relation`
        (usually `this`), and commit_lsn at or below the run's safe bound (silver.safe_bounds).
        seq is gapless and never renumbered, so reading (stored max, bound] again after any crash
        neither skips nor repeats an event; deletes and truncates are events like the others.
        `relation` must keep sequin_events' `source` and seq; a model that filters rows still
        reads each event once (later events of other tables are read again and filtered again).
        Called from a host project's model, an unqualified macro name resolves in the host's
        namespace, not this package's: the macros it calls are named with `changelake.`.
    -#}
    {%- set stored_query -%}
        select source, max({{ seq_column }}) as stored_seq from {{ relation }} group by source
    {%- endset -%}
    {%- set stored = changelake.changelake_stored_positions(relation, stored_query) -%}
    (
        select changes.*
        from {{ ref('sequin_events') }} as changes
        inner join {{ ref('safe_bounds') }} as safe_bounds
            on changes.source = safe_bounds.source
        {%- if stored is not none %}
            left join (
                {{ changelake.rows_as_relation(stored.rows, [['source', 'string'], ['stored_seq', 'bigint']], stored_query) }}
            ) as stored
                on changes.source = stored.source
        {%- endif %}
        where
            changes.commit_lsn <= safe_bounds.safe_lsn
            {%- if stored is not none %}
                and (stored.source is null or changes.seq > stored.stored_seq)
            {%- endif %}
            {%- if stored is not none and stored.rows %}
                {#- The same bound as literals, so Delta skips the files of stored events. -#}
                and (
                    changes.source not in ({% for row in stored.rows %}{{ changelake.sql_literal(row.source) }}{{ ', ' if not loop.last }}{% endfor %})
                    {%- for row in stored.rows %}
                        or (changes.source = {{ changelake.sql_literal(row.source) }} and changes.seq > {{ changelake.sql_literal(row.get('stored_seq', 0)) }})
                    {%- endfor %}
                )
            {%- endif %}
    )
{% endmacro %}
