{% macro pg_xid_visible(xid, xmin, xmax, xip) %}
    {#-
        Whether the transaction `xid` is visible to a Postgres MVCC snapshot (xmin, xmax, xip), as
        pg_visible_in_snapshot() decides it: committed before the snapshot means below xmin, or
        below xmax and not in progress. pgoutput's Begin carries a 32-bit xid while
        pg_current_snapshot() gives 64-bit (epoch-qualified) xids, so the 32-bit xid is first
        widened to the 64-bit xid nearest to xmax (exact while the two are less than 2^31 apart,
        which holds for any transaction that can matter to a page: it committed around its read).
    -#}
    {%- set distance = 'pmod(' ~ xmax ~ ' - ' ~ xid ~ ', 4294967296)' -%}
    {%- set full_xid -%}
        ({{ xmax }} - case when {{ distance }} > 2147483648 then {{ distance }} - 4294967296 else {{ distance }} end)
    {%- endset -%}
    ({{ full_xid }} < {{ xmin }} or ({{ full_xid }} < {{ xmax }} and not array_contains({{ xip }}, {{ full_xid }})))
{%- endmacro %}
