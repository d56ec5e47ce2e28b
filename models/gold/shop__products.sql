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
