{% macro event_keys(events, columns, condition=none) %}
    {#-
        The keys the row events of `events` (sequin_events rows, a relation or CTE name) touch, one
        row per event and key (DESIGN §5, §6): an insert, update or delete touches its record_pk;
        an update that changed the primary key touches its old_record_pk too. Selects `columns`
        of the event, then record_pk (the touched key) and is_old_key (true for the old key of a
        primary-key change). `condition`, when given, is one more filter on the events.
    -#}
    {%- set extra = ' and ' ~ condition if condition else '' -%}
    select
        {%- for column in columns %}
            {{ column }},
        {%- endfor %}
        record_pk,
        false as is_old_key
    from {{ events }}
    where action in ('insert', 'update', 'delete'){{ extra }}
    union all
    select
        {%- for column in columns %}
            {{ column }},
        {%- endfor %}
        old_record_pk as record_pk,
        true as is_old_key
    from {{ events }}
    where action = 'update' and old_record_pk is not null and old_record_pk != record_pk{{ extra }}
{%- endmacro %}
