{% macro change_positions_query(relation, positions) %}
    {#-
        Per source, how far a fold has folded the change log: `positions` (the fold's config
        change_positions) gives the aggregates over `relation` for max_seq (the last event applied)
        and max_commit_lsn (the last placed snapshot row applied). Every applied event left its seq
        on some stored row, and every applied snapshot row its position.
    -#}
    select
        source,
        {{ positions['max_seq'] }} as max_seq,
        {{ positions['max_commit_lsn'] }} as max_commit_lsn
    from {{ relation }}
    group by source
{%- endmacro %}
