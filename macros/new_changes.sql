{% macro new_changes(bounds, incremental) %}
{#-
    CTEs `new_events` and `new_snapshot_rows`: the rows of the CTEs sequin_events and
    snapshot_rows_placed not yet folded. Incrementally (the CTE stored_positions holds per source
    the max seq and max commit_lsn already folded, and `bounds` comes from
    consumer_records_scan_bounds): the events above a stored source's max seq (all of them when
    its stored rows all come from snapshot pages) and the surviving placed snapshot rows above its
    max commit_lsn, and every event and surviving row of a source with nothing stored; bounds'
    literal filters only prune the scans, the joins decide. Otherwise every event and surviving
    placed row. Used by record_changes and, when they do not read it, by consumer_records and
    record_history.
-#}
new_events as (

    select sequin_events.*
    from sequin_events
    {% if incremental %}
        inner join stored_positions
            on sequin_events.source = stored_positions.source
        where
            sequin_events.seq > coalesce(stored_positions.max_seq, 0)
            {% if bounds.stored_rows is not none %}
                and {{ bounds.stored_sources_events_filter }}
            {% endif %}
        union all
        select sequin_events.*
        from sequin_events
        left anti join stored_positions
            on sequin_events.source = stored_positions.source
        {% if bounds.stored_rows is not none %}
            where {{ bounds.other_sources_events_filter }}
        {% endif %}
    {% endif %}

),

new_snapshot_rows as (

    select snapshot_rows_placed.*
    from snapshot_rows_placed
    {% if incremental %}
        inner join stored_positions
            on snapshot_rows_placed.source = stored_positions.source
        where
            not snapshot_rows_placed.is_superseded
            and snapshot_rows_placed.commit_lsn > stored_positions.max_commit_lsn
            {% if bounds.stored_rows is not none %}
                and {{ bounds.stored_sources_snapshot_rows_filter }}
            {% endif %}
        union all
        select snapshot_rows_placed.*
        from snapshot_rows_placed
        left anti join stored_positions
            on snapshot_rows_placed.source = stored_positions.source
        where
            not snapshot_rows_placed.is_superseded
            {% if bounds.stored_rows is not none %}
                and {{ bounds.other_sources_snapshot_rows_filter }}
            {% endif %}
    {% else %}
        where not snapshot_rows_placed.is_superseded
    {% endif %}

)
{%- endmacro %}
