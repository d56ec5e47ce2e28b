{% macro as_of(relation, timestamp_or_lsn, source=none) %}
    {#-
        A SELECT of the state of every table of a source at one position: the versions of
        `relation` (record_history, or a relation with its columns) that were live there, one row
        per live record (deleted records are left out), with record_history's columns.
        timestamp_or_lsn is either
        - a position: an integer commit_lsn, or a Postgres LSN as text ('16/B3A4F2C8'): the state
          after every transaction of the source that committed at or before it;
        - a point in time, as text Spark casts to a timestamp ('2026-11-23 12:00:00', UTC unless
          it says otherwise): per source, the position of the last change committed at or before
          it (a consistent cut of the source's log, never one ordered by timestamps), then as
          above.
        source limits the result to one source; an LSN is a position of one source, so it needs
        `source` (an error otherwise). A record exists in history from its first
        captured change or placed snapshot row on (earlier states are unknown to changelake).
        Examples: `select * from ({{ as_of(ref('record_history'), '2026-11-23 12:00:00') }})` in a
        model, or `dbt show --inline "{{ as_of(ref('record_history'), '0/1A2B3C4D', source='shop') }}"`.
        Called from a host project's model (as changelake.as_of), an unqualified macro name resolves
        in the host's namespace, not this package's: the macros it calls are named with `changelake.`.
    -#}
    {%- set value = timestamp_or_lsn -%}
    {%- set source_filter = ('source = ' ~ changelake.sql_literal(source, 'string')) if source is not none else 'true' -%}
    {%- if value is number and value is not boolean and value == value | int -%}
        {%- set lsn = value | int -%}
    {%- elif value is string and modules.re.fullmatch('[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}', value.strip()) -%}
        {%- set parts = value.strip().split('/') -%}
        {%- set lsn = (parts[0] | int(0, 16)) * 4294967296 + (parts[1] | int(0, 16)) -%}
    {%- elif value is string and value.strip() -%}
        {%- set lsn = none -%}
        {%- set moment = value.strip() -%}
    {%- else -%}
        {{ exceptions.raise_compiler_error(
            "as_of: timestamp_or_lsn must be an integer commit_lsn, a Postgres LSN like '16/B3A4F2C8' "
            ~ "or a timestamp text like '2026-11-23 12:00:00'; got " ~ (value | string)
        ) }}
    {%- endif -%}
    {%- if lsn is not none and lsn < 0 -%}
        {{ exceptions.raise_compiler_error("as_of: a commit_lsn is not negative; got " ~ lsn) }}
    {%- endif -%}
    {%- if lsn is not none and source is none -%}
        {{ exceptions.raise_compiler_error(
            "as_of: an LSN is a position of one source: pass source='<source name>' with it (got "
            ~ (value | string) ~ ")"
        ) }}
    {%- endif -%}
    with as_of_versions as (
        select * from {{ relation }} where {{ source_filter }}
    ),
    {%- if lsn is none %}
    as_of_moment as (
        select coalesce(
            cast({{ changelake.sql_literal(moment, 'string') }} as timestamp),
            raise_error({{ changelake.sql_literal('as_of: not a timestamp: ' ~ moment, 'string') }})
        ) as moment
    ),
    as_of_positions as (
        -- Per source, the last change committed at or before the moment (version starts and ends),
        -- in one pass over the versions (greatest skips a null; a source with neither has a null cut,
        -- which no version passes below).
        select
            as_of_versions.source,
            greatest(
                max(case when as_of_versions.valid_from <= as_of_moment.moment then as_of_versions.valid_from_lsn end),
                max(case when as_of_versions.valid_to <= as_of_moment.moment then as_of_versions.valid_to_lsn end)
            ) as cut_lsn
        from as_of_versions
        cross join as_of_moment
        group by as_of_versions.source
    )
    {%- else %}
    as_of_positions as (
        -- An LSN comes with its source (checked above): the cut is a literal, not a read.
        select {{ changelake.sql_literal(source, 'string') }} as source, cast({{ lsn }} as bigint) as cut_lsn
    )
    {%- endif %}
    select as_of_versions.*
    from as_of_versions
    inner join as_of_positions
        on as_of_versions.source = as_of_positions.source
    where
        as_of_versions.valid_from_lsn <= as_of_positions.cut_lsn
        and (as_of_versions.valid_to_lsn is null or as_of_versions.valid_to_lsn > as_of_positions.cut_lsn)
{%- endmacro %}
