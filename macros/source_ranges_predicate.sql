{% macro source_ranges_predicate(qualifier, column, ranges) %}
    {#-
        A predicate keeping, per listed source, the rows whose `column` lies in its range, as
        literals: `(q.source = 's' and q.column >= low and q.column <= high) or ...`, one
        alternative per dict of `ranges` ({source, low, high}; a none bound is open), both bounds
        inclusive; unlisted sources are dropped, so no ranges at all gives `false`.
        With every range bounded, the overall min(low) / max(high) are also stated on the column
        alone: Delta's data skipping cannot use the alternatives (they mix in the partition column
        `source`, which has no file statistics), but it does use a predicate on the column alone.
    -#}
    {%- set alternatives = [] -%}
    {%- set lows = [] -%}
    {%- set highs = [] -%}
    {%- for bounds in ranges -%}
        {%- set terms = [qualifier ~ '.source = ' ~ sql_literal(bounds['source'])] -%}
        {%- if bounds.get('low') is not none -%}
            {%- do terms.append(qualifier ~ '.' ~ column ~ ' >= ' ~ sql_literal(bounds.get('low'))) -%}
            {%- do lows.append(bounds.get('low')) -%}
        {%- endif -%}
        {%- if bounds.get('high') is not none -%}
            {%- do terms.append(qualifier ~ '.' ~ column ~ ' <= ' ~ sql_literal(bounds.get('high'))) -%}
            {%- do highs.append(bounds.get('high')) -%}
        {%- endif -%}
        {%- do alternatives.append('(' ~ terms | join(' and ') ~ ')') -%}
    {%- endfor -%}
    {%- set predicate = '(' ~ (alternatives | join(' or ') if alternatives else 'false') ~ ')' -%}
    {%- if ranges and lows | length == ranges | length -%}
        {%- set predicate = predicate ~ ' and ' ~ qualifier ~ '.' ~ column ~ ' >= ' ~ sql_literal(lows | min) -%}
    {%- endif -%}
    {%- if ranges and highs | length == ranges | length -%}
        {%- set predicate = predicate ~ ' and ' ~ qualifier ~ '.' ~ column ~ ' <= ' ~ sql_literal(highs | max) -%}
    {%- endif -%}
    {{ return('(' ~ predicate ~ ')') }}
{% endmacro %}
