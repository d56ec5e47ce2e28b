-- A table, not a view like the generated models: tests/integration/test_mongo_flow.py reads it with delta-rs.
{{ config(materialized='table') }}

{{ mongodb_typed_current_state(
    var('changelake_mongodb_demo_source', 'shop_docs'),
    var('changelake_mongodb_demo_database', 'shop'),
    'products',
    [
        ['_id', 'objectid'],
        ['name', 'string'],
        ['price', 'decimal(12,2)'],
        ['qty', 'int'],
        ['views', 'bigint'],
        ['in_stock', 'boolean'],
        ['added_at', 'timestamp'],
        ['tags', 'json'],
    ]
) }}
