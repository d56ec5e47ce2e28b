{% macro replica_identity_name(code) %}
    {#- pgoutput's replica identity code ('d', 'f', 'i', 'n') as Postgres names it in ALTER TABLE. -#}
    case {{ code }}
        when 'd' then 'default'
        when 'f' then 'full'
        when 'i' then 'using index'
        when 'n' then 'nothing'
        else {{ code }}
    end
{%- endmacro %}
