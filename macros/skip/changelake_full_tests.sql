{% macro changelake_full_tests() %}
    {#-
        Whether data tests check whole tables this run: var changelake_full_tests (nightly), or
        the environment variable CHANGELAKE_FULL_TESTS, which ops/scheduled_job.sh sets for the
        build after a failed one, so a failed check runs again instead of passing as unchanged.
    -#}
    {%- set on = ['true', '1', 'yes'] -%}
    {{ return(var('changelake_full_tests', false) | string | lower in on
        or env_var('CHANGELAKE_FULL_TESTS', '') | lower in on) }}
{% endmacro %}
