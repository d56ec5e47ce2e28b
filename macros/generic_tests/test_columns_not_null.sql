{% test columns_not_null(model, column_names) %}
    {#-
        Fails with every row in which one of the given columns is null, naming those columns
        (null_columns). One query per model instead of one `not_null` test per column: on Spark
        each test is a job of its own, and a model's columns are all read by the same scan.
        `model` may come aliased already (a test's `where` config wraps it in a subquery).
    -#}
    select
        concat_ws(
            ', ',
            {%- for column_name in column_names %}
                case when {{ column_name }} is null then '{{ column_name }}' end
                {%- if not loop.last %},{% endif %}
            {%- endfor %}
        ) as null_columns,
        *
    from {{ model }}
    where
        {%- for column_name in column_names %}
            {{ column_name }} is null{% if not loop.last %} or{% endif %}
        {%- endfor %}
{% endtest %}
