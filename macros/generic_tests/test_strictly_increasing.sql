{% test strictly_increasing(model, column_name, partition_by, order_by) %}
    {#- Fails with every row whose column_name is not greater than the previous row's, rows taken
        in order_by order within partition_by. -#}
    with ordered as (
        select
            {{ partition_by | join(', ') }},
            {{ order_by | join(', ') }},
            {{ column_name }} as checked_value,
            lag({{ column_name }}) over (
                partition by {{ partition_by | join(', ') }}
                order by {{ order_by | join(', ') }}
            ) as previous_value
        from {{ model }}
    )

    select *
    from ordered
    where previous_value is not null and checked_value <= previous_value
{% endtest %}
