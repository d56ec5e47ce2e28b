{% macro changelake_warehouse() %}
    {#- The warehouse root: CHANGELAKE_WAREHOUSE, else ./warehouse under $PWD (as in profiles.yml). -#}
    {{ return(env_var('CHANGELAKE_WAREHOUSE', env_var('PWD', '.') ~ '/warehouse').rstrip('/')) }}
{% endmacro %}
