{% test changelake_rules(model, not_null=[], not_null_when={}, accepted_values={}, unique=none) %}
    {#-
        A model's column rules in one query, so one scan and one Spark job instead of one test per
        rule (on Spark each test is a job of its own, and every rule reads the same rows):
        - not_null: columns that must never be null;
        - not_null_when: {column: condition}: the column must not be null where the condition holds;
        - accepted_values: {column: [values]}: a value outside the list fails (a null passes, as in
          dbt's accepted_values; not_null catches it);
        - unique: columns whose combination identifies a row.
        With `unique`, fails with one row per key held by more than one row (key_rows) or by a row
        that breaks a rule; without it, with each row that breaks a rule. `problems` names what a
        row of the key breaks (one such row's, when several do). `model` may come aliased already
        (a test's `where` config wraps it in a subquery).
    -#}
    {%- set checks = [] -%}
    {%- for column in not_null -%}
        {%- do checks.append("case when " ~ column ~ " is null then '" ~ column ~ " is null' end") -%}
    {%- endfor -%}
    {%- for column, condition in not_null_when.items() -%}
        {%- do checks.append(
            "case when " ~ column ~ " is null and (" ~ condition ~ ") then '" ~ column ~ " is null' end") -%}
    {%- endfor -%}
    {%- for column, values in accepted_values.items() -%}
        {%- set listed = [] -%}
        {%- for value in values -%}
            {%- do listed.append("'" ~ value ~ "'") -%}
        {%- endfor -%}
        {%- do checks.append(
            "case when " ~ column ~ " not in (" ~ listed | join(', ') ~ ") then '" ~ column
            ~ " not accepted' end") -%}
    {%- endfor -%}
    {%- set row_problems = "concat_ws(', ', " ~ (checks | join(', ') if checks else "cast(null as string)") ~ ")" -%}
    {%- if unique %}
        select
            {{ unique | join(', ') }},
            count(*) as key_rows,
            max(row_problems) as problems
        from (
            select
                {{ unique | join(', ') }},
                {{ row_problems }} as row_problems
            from {{ model }}
        ) as checked
        group by {{ unique | join(', ') }}
        having count(*) > 1 or max(row_problems) != ''
    {%- else %}
        select *
        from (
            select
                {{ row_problems }} as problems,
                *
            from {{ model }}
        ) as checked
        where problems != ''
    {%- endif %}
{% endtest %}
